"""A user's image for image-to-video: checked, first frame, RGB, scaled and cropped to the target size.

``check_image`` refuses what cannot be used (missing, empty, not an image, cut short, too many
pixels) before any heavy work, with a message naming the file; ``describe_image`` lists what the
preparation changes (animated, CMYK, transparency, 16 bit, EXIF rotation, scaling, cropping) so the
user can be told; ``fit_image`` returns the RGB image of exactly the requested size.
"""
from __future__ import annotations

import re
import warnings
from contextlib import contextmanager
from pathlib import Path

from engine.settings.values import MAX_SIDE, MIN_SIDE, InputError

# Refuse images above this many pixels before decoding them (decompression bombs).
# Checked from the header here; PIL's own global Image.MAX_IMAGE_PIXELS is left alone.
MAX_IMAGE_PIXELS = 80_000_000
FORMATS_HINT = "upload a PNG, JPEG or WebP image"
HIGH_BIT_MODES = {"I;16": "16-bit", "I;16L": "16-bit", "I;16B": "16-bit", "I;16N": "16-bit",
                  "I": "32-bit integer", "F": "floating-point"}
ALPHA_MODES = ("RGBA", "LA", "PA", "RGBa", "La")
UNSUPPORTED_SUFFIXES = {".heic": "HEIC", ".heif": "HEIF", ".svg": "SVG", ".psd": "Photoshop"}


class ImageError(InputError):
    """An image cannot be used; the message names the file and says what to change."""


def _label(name: str, path) -> str:
    return f"{name} {Path(path).name!r}"


def _too_large(label: str, pixels: int, size: tuple[int, int] | None = None) -> ImageError:
    shown = f"{size[0]}x{size[1]} ({pixels / 1e6:.0f} megapixels)" if size else f"{pixels / 1e6:.0f} megapixels"
    return ImageError(f"{label} is {shown}, above the {MAX_IMAGE_PIXELS // 1_000_000}-megapixel limit; "
                      "scale it down (for example to 1920x1080) and upload it again")


def _damaged(label: str, exc: BaseException) -> ImageError:
    text = str(exc) or exc.__class__.__name__
    reason = "the file ends early" if "truncated" in text.lower() else text[:120]
    return ImageError(f"{label} is truncated or damaged ({reason}); save or export it again and upload the new file")


@contextmanager
def open_image(path, name: str = "image"):
    """Open ``path`` lazily (the header only), refusing a missing, empty, unknown or too large file."""
    from PIL import Image, UnidentifiedImageError

    file = Path(path)
    label = _label(name, path)
    if file.is_dir():
        raise ImageError(f"{name} {str(path)!r} is a folder, not an image file; pick an image file")
    if not file.is_file():
        raise ImageError(f"{name} {str(path)!r} does not exist; check the path or upload it again")
    if file.stat().st_size == 0:
        raise ImageError(f"{label} is empty (0 bytes); {FORMATS_HINT}")
    try:
        with warnings.catch_warnings():
            # Between PIL's limit and twice it PIL only warns; the explicit check below refuses.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            img = Image.open(file)
    except Image.DecompressionBombError as exc:
        found = re.search(r"\((\d+) pixels\)", str(exc))
        raise _too_large(label, int(found.group(1)) if found else 2 * MAX_IMAGE_PIXELS) from None
    except UnidentifiedImageError:
        kind = UNSUPPORTED_SUFFIXES.get(file.suffix.lower())
        what = f"{kind} files are not supported" if kind else "not a known image format"
        raise ImageError(f"{label} is not a readable image ({what}); {FORMATS_HINT}") from None
    except PermissionError:
        raise ImageError(f"{label} cannot be read (permission denied); "
                         "check its permissions or copy it elsewhere") from None
    except Exception as exc:  # a format was recognised but its plugin failed (OSError, ValueError...)
        raise _damaged(label, exc) from None
    with img:
        if img.width < 1 or img.height < 1:
            raise ImageError(f"{label} has no pixels ({img.width}x{img.height}); {FORMATS_HINT}")
        if img.width * img.height > MAX_IMAGE_PIXELS:
            raise _too_large(label, img.width * img.height, img.size)
        yield img


def _to_8bit_gray(img):
    """A 16-bit, 32-bit or float grayscale image scaled (not clipped) to 8-bit 'L'."""
    import numpy as np
    from PIL import Image

    values = np.asarray(img).astype(np.float64)
    low, high = float(values.min()), float(values.max())
    if img.mode.startswith("I;16"):
        values = values / 257.0                       # 0..65535 -> 0..255
    elif img.mode == "F" and low >= 0 and high <= 1:
        values = values * 255.0                       # a 0..1 float image
    elif low >= 0 and high <= 255:
        pass                                          # already 8-bit values
    elif img.mode == "I" and low >= 0 and high <= 65535:
        values = values / 257.0                       # a 16-bit file opened as 32-bit 'I'
    else:
        values = (values - low) * (255.0 / (high - low)) if high > low else values * 0
    return Image.fromarray(np.clip(np.rint(values), 0, 255).astype(np.uint8), "L")


def _cmyk_to_rgb(img):
    """CMYK to RGB through the image's colour profile when it has one, else PIL's plain formula."""
    profile = img.info.get("icc_profile")
    if profile:
        try:
            import io

            from PIL import ImageCms

            return ImageCms.profileToProfile(img, ImageCms.ImageCmsProfile(io.BytesIO(profile)),
                                             ImageCms.createProfile("sRGB"), outputMode="RGB")
        except Exception:  # no littlecms, or a broken profile: fall back to the formula
            pass
    return img.convert("RGB")


def _first_frame_rgb(img, label: str):
    """(RGB image, notes) from the first frame of an open image; decodes it (a cut file fails here)."""
    from PIL import Image, ImageOps

    notes = []
    frames = getattr(img, "n_frames", 1) if getattr(img, "is_animated", False) else 1
    if frames > 1 and img.format != "MPO":   # MPO: a camera JPEG with a preview, not an animation
        notes.append(f"animated image: the first of {frames} frames is used")
    try:
        img.seek(0)
        img.load()
        orientation = img.getexif().get(0x0112, 1)
        frame = ImageOps.exif_transpose(img) if orientation in range(2, 9) else img
    except ImageError:
        raise
    except Exception as exc:
        raise _damaged(label, exc) from None
    if frame is not img:
        notes.append("turned upright as its EXIF orientation says")
    mode = frame.mode
    if mode in HIGH_BIT_MODES:
        frame = _to_8bit_gray(frame)
        notes.append(f"{HIGH_BIT_MODES[mode]} grayscale image scaled to 8 bits")
    elif mode == "CMYK":
        frame = _cmyk_to_rgb(frame)
        notes.append("CMYK image converted to RGB")
    if frame.mode in ALPHA_MODES or "transparency" in frame.info:
        rgba = frame.convert("RGBA")
        if rgba.getchannel("A").getextrema()[0] < 255:
            notes.append("transparent areas filled with white")
        frame = Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba)
    try:
        rgb = frame.convert("RGB")
    except ValueError:
        raise ImageError(f"{label} uses colour mode {mode!r}, which cannot be converted to RGB; "
                         "save it as an RGB PNG or JPEG") from None
    return rgb, notes


def _cover(size: tuple[int, int], width: int, height: int) -> tuple[float, tuple[int, int]]:
    scale = max(width / size[0], height / size[1])
    return scale, (max(width, round(size[0] * scale)), max(height, round(size[1] * scale)))


def _size_notes(size: tuple[int, int], width: int, height: int) -> list[str]:
    notes = []
    scale, (covered_w, covered_h) = _cover(size, width, height)
    if scale > 1.25:
        notes.append(f"the image ({size[0]}x{size[1]}) is smaller than the video ({width}x{height}) and is "
                     f"scaled up {scale:.1f}x; a larger image gives a sharper start")
    cut_w, cut_h = 1 - width / covered_w, 1 - height / covered_h
    if max(cut_w, cut_h) > 0.1:
        side, cut = ("width", cut_w) if cut_w >= cut_h else ("height", cut_h)
        notes.append(f"its shape ({size[0]}x{size[1]}) differs from the video's ({width}x{height}): "
                     f"{cut:.0%} of its {side} is cropped away")
    return notes


def check_image(path, name: str = "image", width: int | None = None, height: int | None = None) -> list[str]:
    """Refuse an image that cannot be used (ImageError naming the file); return notes for the user.

    Decodes the first frame fully, so a file cut short is caught here rather than in the engine.
    """
    label = _label(name, path)
    with open_image(path, name) as img:
        try:
            img.verify()   # PNG: every chunk's checksum; other formats: what their plugin checks
        except Exception as exc:
            raise _damaged(label, exc) from None
    with open_image(path, name) as img:
        rgb, notes = _first_frame_rgb(img, label)
    if width and height:
        notes += _size_notes(rgb.size, width, height)
    return notes


def describe_image(path, width: int | None = None, height: int | None = None) -> list[str]:
    """What preparing ``path`` changes, as sentences for the user; [] for an unusable file (never raises).

    For example "animated image: the first of 12 frames is used", "CMYK image converted to RGB",
    "transparent areas filled with white"; with ``width`` and ``height`` also scaling and cropping.
    """
    try:
        return check_image(path, "image", width, height)
    except InputError:
        return []


def upright_rgb(path: str | Path, name: str = "image"):
    """The image ``fit_image`` starts from, at full size: the first frame, upright, RGB, 8 bits.

    Saved as a PNG and fitted again, it gives the same pixels as the original file.
    Raises ImageError for an unusable file.
    """
    with open_image(path, name) as img:
        rgb, _ = _first_frame_rgb(img, _label(name, path))
    return rgb


def fit_image(path: str | Path, width: int, height: int, name: str = "image"):
    """Open ``path`` and scale it to cover ``width`` x ``height``, then centre-crop (aspect kept).

    Always an RGB image of exactly ``width`` x ``height``: the first frame of an animation,
    transparency on white, CMYK and 16-bit converted. Raises ImageError for an unusable file.
    """
    return fit_rgb(upright_rgb(path, name), width, height)


def fit_rgb(rgb, width: int, height: int):
    """An RGB PIL image scaled to cover ``width`` x ``height`` and centre-cropped to exactly that (fit_image's
    fitting, for an image already in memory: a video's frame)."""
    from PIL import Image

    # Resample only the centred source region that covers the target: never an intermediate image
    # larger than the source (a 8000x1 strip scaled to cover 2048x2048 would be 16 gigapixels).
    scale = max(width / rgb.width, height / rgb.height)
    crop_w, crop_h = min(rgb.width, width / scale), min(rgb.height, height / scale)
    left, top = (rgb.width - crop_w) / 2, (rgb.height - crop_h) / 2
    return rgb.resize((width, height), Image.Resampling.LANCZOS, box=(left, top, left + crop_w, top + crop_h))


def size_for_aspect(image_size: tuple[int, int], width: int, height: int, multiple: int = 16,
                    low: int = MIN_SIDE, high: int = MAX_SIDE) -> tuple[int, int]:
    """A video size with the image's aspect and about the pixels of ``width`` x ``height``.

    Both sides are multiples of ``multiple`` within [low, high], so nothing of the image is cropped
    beyond rounding.
    """
    img_w, img_h = image_size
    area = max(1, width * height)
    aspect = img_w / max(1, img_h)
    new_w = (area * aspect) ** 0.5
    new_h = new_w / aspect

    def snap(value: float) -> int:
        return int(min(high - high % multiple, max(low + (-low) % multiple, round(value / multiple) * multiple)))

    return snap(new_w), snap(new_h)
