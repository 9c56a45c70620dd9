"""Preparing a user's image for image-to-video: first frame, RGB, cropped to the target size."""
from __future__ import annotations

from pathlib import Path

# Refuse images above this many pixels before decoding them (decompression bombs).
MAX_IMAGE_PIXELS = 80_000_000


def fit_image(path: str | Path, width: int, height: int):
    """Open ``path`` and scale it to cover ``width`` x ``height``, then centre-crop (aspect kept)."""
    from PIL import Image, ImageOps

    Image.MAX_IMAGE_PIXELS = MAX_IMAGE_PIXELS
    with Image.open(path) as img:
        img.seek(0)
        img = ImageOps.exif_transpose(img)
        if img.mode in ("RGBA", "LA") or (img.mode == "P" and "transparency" in img.info):
            img = img.convert("RGBA")
            background = Image.new("RGBA", img.size, (255, 255, 255, 255))
            img = Image.alpha_composite(background, img)
        img = img.convert("RGB")
        scale = max(width / img.width, height / img.height)
        size = (max(width, round(img.width * scale)), max(height, round(img.height * scale)))
        img = img.resize(size, Image.Resampling.LANCZOS)
        left, top = (img.width - width) // 2, (img.height - height) // 2
        return img.crop((left, top, left + width, top + height))
