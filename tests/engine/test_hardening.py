"""Hostile input is refused before any heavy work, with a message naming what to change.

Images (cut short, empty, not an image, decompression bombs, odd colour modes, animations),
prompts (control and invisible characters), numbers (strings, NaN, inf, huge, -0.0, booleans,
None), damaged safetensors files in a model folder, and ill-typed preset files.
"""
from __future__ import annotations

import io
import json
import math
import shutil
import struct

import numpy as np
import pytest
from PIL import Image

from engine.models.catalog import ModelCatalog
from engine.models.refs import check_model_folder
from engine.errors import ModelError
from engine.models.weights import WeightFileError, read_header
from engine.settings.images import MAX_IMAGE_PIXELS, ImageError, check_image, describe_image, fit_image
from engine.settings.presets import PresetError, load_preset_file
from engine.settings.request import MAX_PROMPT_CHARS, check_request, check_request_with_notes, clean_prompt
from engine.settings.values import SETTING_NAMES, InputError
from tests.conftest import said, tiny_request
from tests.helpers.images import png_claiming

W, H = 64, 48


@pytest.fixture
def good(presets, outputs):
    return tiny_request(presets, "selftest-t2v", outputs)


@pytest.fixture
def i2v(presets, outputs, image_file):
    return tiny_request(presets, "selftest-i2v", outputs, mode="i2v", image=str(image_file))


def _refused(request) -> str:
    with pytest.raises(InputError) as info:
        check_request(request)
    return str(info.value)


# ----- images: refused --------------------------------------------------------------------------

def _noise(size=(300, 200)) -> Image.Image:
    return Image.fromarray(np.random.default_rng(0).integers(0, 255, (size[1], size[0], 3), dtype=np.uint8))


@pytest.mark.parametrize("fmt, suffix", [("JPEG", "jpg"), ("PNG", "png"), ("WEBP", "webp")])
def test_an_image_cut_in_half_is_refused_naming_the_file(i2v, tmp_path, fmt, suffix):
    buffer = io.BytesIO()
    _noise().save(buffer, fmt)
    cut = tmp_path / f"half.{suffix}"
    cut.write_bytes(buffer.getvalue()[: len(buffer.getvalue()) // 2])
    message = _refused(i2v.with_values(image=str(cut)))
    assert f"Image 'half.{suffix}' is truncated or damaged" in message
    assert "save or export it again" in message
    with pytest.raises(ImageError, match="truncated or damaged"):
        fit_image(cut, W, H)


def test_a_damaged_png_checksum_is_refused(i2v, tmp_path):
    buffer = io.BytesIO()
    _noise().save(buffer, "PNG")
    data = bytearray(buffer.getvalue())
    data[len(data) // 2] ^= 0xFF   # flip a byte inside the compressed data
    bad = tmp_path / "flipped.png"
    bad.write_bytes(bytes(data))
    assert "Image 'flipped.png' is truncated or damaged" in _refused(i2v.with_values(image=str(bad)))


def test_the_last_image_is_checked_and_named_too(i2v, tmp_path):
    empty = tmp_path / "end.png"
    empty.write_bytes(b"")
    text = tmp_path / "end.jpg"
    text.write_text("not an image at all")
    assert "Last image 'end.png' is empty (0 bytes)" in _refused(i2v.with_values(last_image=str(empty)))
    assert "Last image 'end.jpg' is not a readable image" in _refused(i2v.with_values(last_image=str(text)))


@pytest.mark.parametrize("value, expected", [
    (123, "image must be a file path, got int"),
    (["a.png"], "image must be a file path, got list"),
])
def test_an_image_that_is_not_a_path_is_refused(i2v, value, expected):
    assert said(expected) in _refused(i2v.with_values(image=value))


def test_a_folder_or_heic_given_as_image_says_so(i2v, tmp_path):
    assert "is a folder, not an image file" in _refused(i2v.with_values(image=str(tmp_path)))
    heic = tmp_path / "IMG_0001.HEIC"
    heic.write_bytes(b"\0\0\0\x18ftypheic" + b"\0" * 64)
    assert "'IMG_0001.HEIC' is not a readable image (HEIC files are not supported)" in _refused(
        i2v.with_values(image=str(heic)))


@pytest.mark.parametrize("width, height, expected", [
    (20000, 20000, "is 400 megapixels, above the 80-megapixel limit"),   # PIL's own bomb error
    (10000, 10000, "is 10000x10000 (100 megapixels), above the 80-megapixel limit"),   # PIL only warns
    (9000, 9000, "is 9000x9000 (81 megapixels), above the 80-megapixel limit"),   # PIL says nothing
])
def test_a_decompression_bomb_is_refused_from_its_header_without_decoding(
        i2v, tmp_path, monkeypatch, width, height, expected):
    from PIL import ImageFile

    bomb = tmp_path / "bomb.png"
    bomb.write_bytes(png_claiming(width, height))
    pil_limit = Image.MAX_IMAGE_PIXELS

    def no_decoding(self):
        raise AssertionError("a decompression bomb was decoded")

    monkeypatch.setattr(ImageFile.ImageFile, "load", no_decoding)
    message = _refused(i2v.with_values(image=str(bomb)))
    assert f"Image 'bomb.png' {expected}" in message and "scale it down" in message
    with pytest.raises(ImageError, match="80-megapixel limit"):
        fit_image(bomb, W, H)
    assert Image.MAX_IMAGE_PIXELS == pil_limit, "PIL's global limit must not change"
    assert MAX_IMAGE_PIXELS == 80_000_000


def test_a_text_to_video_request_with_a_last_image_is_refused(good, image_file):
    assert "A last image was given but the mode is text-to-video" in _refused(
        good.with_values(last_image=str(image_file)))


# ----- images: odd modes become an RGB image of exactly the requested size ----------------------

def _save(img: Image.Image, path, **kwargs):
    img.save(path, **kwargs)
    return path


def _cmyk(tmp_path):
    return _save(Image.new("CMYK", (80, 60), (0, 255, 255, 0)), tmp_path / "cmyk.jpg", quality=95)


def _rgba_transparent(tmp_path):
    img = Image.new("RGBA", (80, 60), (255, 0, 0, 0))      # fully transparent red
    return _save(img, tmp_path / "rgba.png")


def _rgba_opaque(tmp_path):
    return _save(Image.new("RGBA", (80, 60), (10, 200, 30, 255)), tmp_path / "opaque.png")


def _palette_transparent(tmp_path):
    img = Image.new("P", (80, 60), 1)
    img.putpalette([0, 0, 0, 0, 0, 255] + [0] * 762)
    return _save(img, tmp_path / "palette.png", transparency=1)


def _gray16(tmp_path):
    return _save(Image.fromarray(np.full((60, 80), 32768, np.uint16)), tmp_path / "gray16.png")


def _la(tmp_path):
    return _save(Image.new("LA", (80, 60), (100, 128)), tmp_path / "la.png")


def _gif(tmp_path):
    frames = [Image.new("RGB", (80, 60), c) for c in ((255, 0, 0), (0, 255, 0), (0, 0, 255))]
    return _save(frames[0], tmp_path / "anim.gif", save_all=True, append_images=frames[1:], duration=100, loop=0)


def _webp(tmp_path):
    frames = [Image.new("RGB", (80, 60), c) for c in ((255, 0, 0), (0, 255, 0), (0, 0, 255), (9, 9, 9))]
    return _save(frames[0], tmp_path / "anim.webp", save_all=True, append_images=frames[1:], duration=100,
                 loop=0, lossless=True)


def _rotated(tmp_path):
    img = Image.new("RGB", (80, 60), (200, 200, 0))
    exif = Image.Exif()
    exif[0x0112] = 6   # rotate 90 degrees clockwise to show upright
    return _save(img, tmp_path / "rotated.jpg", exif=exif, quality=95)


def _bilevel(tmp_path):
    return _save(Image.new("1", (80, 60), 1), tmp_path / "bilevel.png")


@pytest.mark.parametrize("build, pixel, note", [
    (_cmyk, (255, 0, 0), "CMYK image converted to RGB"),
    (_rgba_transparent, (255, 255, 255), "transparent areas filled with white"),
    (_rgba_opaque, (10, 200, 30), None),
    (_palette_transparent, (255, 255, 255), "transparent areas filled with white"),
    (_gray16, (128, 128, 128), "16-bit grayscale image scaled to 8 bits"),
    (_la, (177, 177, 177), "transparent areas filled with white"),   # grey 100 at half alpha on white
    (_gif, (255, 0, 0), "animated image: the first of 3 frames is used"),
    (_webp, (255, 0, 0), "animated image: the first of 4 frames is used"),
    (_rotated, (200, 200, 0), "turned upright as its EXIF orientation says"),
    (_bilevel, (255, 255, 255), None),
])
def test_every_kind_of_image_becomes_rgb_of_the_requested_size(tmp_path, build, pixel, note):
    path = build(tmp_path)
    check_image(path)
    fitted = fit_image(path, W, H)
    assert fitted.mode == "RGB" and fitted.size == (W, H)
    assert all(abs(a - b) <= 6 for a, b in zip(fitted.getpixel((W // 2, H // 2)), pixel)), fitted.getpixel((32, 24))
    notes = describe_image(path)
    assert (note in notes) if note else notes == []


def test_16_bit_grayscale_keeps_its_gradient_instead_of_turning_white(tmp_path):
    ramp = np.tile(np.linspace(0, 65535, 80).astype(np.uint16), (60, 1))
    path = _save(Image.fromarray(ramp), tmp_path / "ramp16.png")
    assert Image.open(path).mode == "I;16"
    fitted = np.asarray(fit_image(path, 80, 64))[..., 0]
    assert fitted[:, 0].max() < 10 and fitted[:, -1].min() > 245
    assert 110 < fitted[:, 40].mean() < 145     # the middle of the ramp is mid-grey


def test_exif_rotation_is_applied_before_cropping(tmp_path):
    fitted = fit_image(_rotated(tmp_path), 60, 80)   # 80x60 stored, 60x80 upright: no crop needed
    assert fitted.size == (60, 80)
    assert describe_image(_rotated(tmp_path), 60, 80) == ["turned upright as its EXIF orientation says"]


def test_size_notes_say_when_an_image_is_scaled_up_or_cropped(tmp_path):
    small = _save(Image.new("RGB", (40, 10), (1, 2, 3)), tmp_path / "small.png")
    notes = describe_image(small, 64, 48)
    assert "the image (40x10) is smaller than the video (64x48) and is scaled up 4.8x" in notes[0]
    assert "its shape (40x10) differs from the video's (64x48): 67% of its width is cropped away" in notes[1]
    assert describe_image(small) == []


def test_a_thin_strip_is_fitted_without_a_giant_intermediate_image(tmp_path):
    strip = _save(Image.new("RGB", (8000, 1), (9, 90, 200)), tmp_path / "strip.png")
    fitted = fit_image(strip, 2048, 2048)    # scaling first would make a 16-gigapixel image
    assert fitted.size == (2048, 2048) and fitted.getpixel((1024, 1024)) == (9, 90, 200)


def test_describe_image_never_raises(tmp_path):
    assert describe_image(tmp_path / "missing.png") == []
    (tmp_path / "bad.png").write_text("no")
    assert describe_image(tmp_path / "bad.png") == []


def test_check_inputs_with_notes_names_the_image_and_its_notes(i2v, tmp_path):
    gif = _gif(tmp_path)
    rgba = _rgba_transparent(tmp_path)
    checked, notes = check_request_with_notes(i2v.with_values(image=str(gif), last_image=str(rgba)))
    assert checked.image == str(gif)
    assert "image 'anim.gif': animated image: the first of 3 frames is used" in notes
    assert "last image 'rgba.png': transparent areas filled with white" in notes


# ----- prompts ---------------------------------------------------------------------------------

@pytest.mark.parametrize("text, cleaned, warnings", [
    ("a red fox", "a red fox", []),
    ("  a\tred   fox  ", "a red fox", []),
    ("a\x00 red\x07 fox\x7f", "a red fox", ["removed 3 control characters"]),
    ("a red\x1b[31m fox\x1b[0m", "a red fox", ["removed 2 control characters"]),
    ("a\u200b red\ufeff fox\u202e", "a red fox", [
        "removed 3 invisible characters (zero-width space, byte-order mark or direction mark)"]),
    ("a\u00a0red\u3000fox", "a red fox", []),
    ("line one\r\nline two\rline three", "line one\nline two\nline three", []),
    ("para one\n\n\n\n\npara two  \n  ", "para one\n\npara two", []),
    ("cafe\u0301", "caf\u00e9", []),                                  # NFC
    ("fox\ud800", "fox", ["removed 1 broken character (unpaired surrogate)"]),
    ("\x01", "", ["removed 1 control character"]),
    ("a\x0cb", "a\nb", []),                                           # form feed separates, not removed
    ("family \U0001F468\u200d\U0001F469", "family \U0001F468\u200d\U0001F469", []),   # ZWJ kept
])
def test_clean_prompt(text, cleaned, warnings):
    assert clean_prompt(text) == (cleaned, warnings)


def test_the_request_carries_the_cleaned_prompts_and_notes_say_what_changed(good):
    checked, notes = check_request_with_notes(good.with_values(prompt="a\x00 cat\u200b  on a   mat",
                                                     negative_prompt="  blurry\x1b[0m, \tlow quality "))
    assert checked.prompt == "a cat on a mat"
    assert checked.negative_prompt == "blurry, low quality"
    assert notes == ["prompt: removed 1 control character",
                     "prompt: removed 1 invisible character (zero-width space, byte-order mark or direction mark)",
                     "negative prompt: removed 1 control character"]
    assert check_request(checked) == checked and check_request_with_notes(checked)[1] == []


@pytest.mark.parametrize("change, expected", [
    (dict(prompt="\x00\x01\u200b"), "the prompt is empty once control characters are removed"),
    (dict(prompt=" \t\n "), "the prompt is empty: describe what the video should show"),
    (dict(prompt=None), "the prompt is empty"),
    (dict(prompt=42), "the prompt must be text, got int"),
    (dict(prompt="x" * (MAX_PROMPT_CHARS + 1)), f"the prompt has {MAX_PROMPT_CHARS + 1} characters"),
    (dict(negative_prompt="x" * (MAX_PROMPT_CHARS + 5)), f"the negative prompt has {MAX_PROMPT_CHARS + 5} characters"),
    (dict(negative_prompt=["blurry"]), "the negative prompt must be text, got list"),
])
def test_bad_prompts_are_refused(good, change, expected):
    assert said(expected) in _refused(good.with_values(**change))


def test_length_is_counted_after_cleaning(good):
    checked = check_request(good.with_values(prompt="a cat" + " " * (MAX_PROMPT_CHARS * 2), negative_prompt=None))
    assert checked.prompt == "a cat" and checked.negative_prompt == ""


# ----- numbers ---------------------------------------------------------------------------------

@pytest.mark.parametrize("field, value, expected", [
    ("width", "64", 64),
    ("width", " 64 ", 64),
    ("width", "64.0", 64),
    ("width", 64.0, 64),
    ("width", np.int64(64), 64),
    ("steps", np.float64(4.0), 4),
    ("frames", "9", 9),
    ("seed", None, -1),                      # no seed: random
    ("seed", "7", 7),
    ("guidance", "5", 5.0),
    ("guidance", " 4.5 ", 4.5),
    ("guidance", 5, 5.0),
    ("guidance", -0.0, 0.0),
    ("shift", np.float32(3.0), 3.0),
])
def test_numbers_given_as_strings_or_integral_floats_are_normalised(good, field, value, expected):
    checked = check_request(good.with_values(**{field: value}))
    got = getattr(checked.settings if field in SETTING_NAMES else checked, field)
    assert got == expected and type(got) is type(expected)
    if field == "guidance":
        assert math.copysign(1, got) == 1        # never -0.0


@pytest.mark.parametrize("field, value, expected", [
    ("width", "64.5", "width must be a whole number, got '64.5'"),
    ("width", 64.5, "width must be a whole number, got 64.5"),
    ("width", float("nan"), "width must be a whole number, got nan"),
    ("width", float("inf"), "width must be a whole number, got inf"),
    ("height", float("-inf"), "height must be a whole number, got -inf"),
    ("width", "nan", "width must be a whole number, got 'nan'"),
    ("width", "sixty-four", "width must be a whole number, got 'sixty-four'"),
    ("width", 1e30, "width 1e+30 is out of range: use 32 to 2048 pixels"),
    ("frames", 1e30, "frames 1e+30 is out of range"),
    ("steps", "1e30", "steps 1e+30 is out of range"),
    ("seed", 1e30, "seed 1e+30 is out of range"),
    ("seed", 2**70, "seed 1.18e+21 is out of range"),
    ("seed", 2**32, "seed 4294967296 is out of range: use -1 for random or 0 to 4294967295"),
    ("frames", -0.0, "frames 0 is out of range"),
    ("steps", True, "steps must be a whole number, got True"),
    ("width", False, "width must be a whole number, got False"),
    ("width", None, "width is missing: give a whole number"),
    ("frames", "", "frames is missing: give a whole number"),
    ("fps", [16], "fps must be a whole number, got list"),
    ("steps", {"n": 4}, "steps must be a whole number, got dict"),
    ("guidance", float("nan"), "guidance must be a number, got nan"),
    ("guidance", float("inf"), "guidance must be a number, got inf"),
    ("guidance", "inf", "guidance must be a number, got 'inf'"),
    ("guidance", 1e30, "guidance 1e+30 is out of range: use 0 to 30.0"),
    ("guidance", 10**400, "guidance must be a number"),     # too big for a float
    ("guidance", True, "guidance must be a number, got True"),
    ("guidance", None, "guidance is missing: give a number"),
    ("guidance", "  ", "guidance is missing: give a number"),
    ("guidance", [5.0], "guidance must be a number, got [5.0]"),
    ("shift", -0.0, "shift 0.0 is out of range: use a value above 0"),
    ("shift", -1e30, "shift -1e+30 is out of range"),
    ("vae_tiling", "on", "VAE tiling must be on, off or auto, got 'on'"),
    ("outputs_dir", None, "no outputs folder given: choose one with --outputs"),
    ("outputs_dir", "", "no outputs folder given"),
])
def test_bad_numbers_are_refused_with_a_clear_message(good, field, value, expected):
    assert said(expected) in _refused(good.with_values(**{field: value}))


# ----- model folders with damaged safetensors files --------------------------------------------

@pytest.fixture
def model_copy(model_dirs, tmp_path):
    folder = tmp_path / "tiny"
    shutil.copytree(model_dirs["tiny-t2v"], folder)
    check_model_folder(folder)   # intact before each test damages it
    return folder


def _weights(folder, component="transformer"):
    files = sorted((folder / component).glob("*.safetensors"))
    assert files
    return files[0]


def _damage_refused(folder, target, *expected):
    with pytest.raises(ModelError) as info:
        check_model_folder(folder)
    message = str(info.value)
    assert f"weight file {target.parent.name}/{target.name} is damaged" in message
    assert "download the model again" in message
    for text in expected:
        assert text in message
    with pytest.raises(ModelError, match="is damaged"):
        ModelCatalog().check_folder(str(folder))
    return message


def test_a_truncated_safetensors_file_is_refused(model_copy):
    target = _weights(model_copy)
    data = target.read_bytes()
    target.write_bytes(data[: len(data) // 2])
    _damage_refused(model_copy, target, "the file is cut short", f"Delete {target}")


def test_a_safetensors_header_of_garbage_is_refused(model_copy):
    target = _weights(model_copy, "vae")
    data = bytearray(target.read_bytes())
    (length,) = struct.unpack("<Q", data[:8])
    data[8: 8 + length] = b"\xff" * length
    target.write_bytes(bytes(data))
    _damage_refused(model_copy, target, "its header is not valid JSON")


def test_an_absurd_header_length_is_refused_as_a_cut_file_without_quoting_it(model_copy):
    target = _weights(model_copy, "text_encoder")
    data = target.read_bytes()
    target.write_bytes(struct.pack("<Q", 2**62) + data[8:])
    message = _damage_refused(model_copy, target, "its header runs past the end of the file: the file is cut short")
    assert f"{2**62:,}" not in message and str(2**62) not in message


def test_a_file_that_is_no_safetensors_one_is_said_to_be_so_not_quoted_as_a_number(model_copy):
    target = _weights(model_copy, "vae")
    target.write_bytes(b"OggS\x00\x02" + bytes(range(256)) * 40)   # another format's file, renamed
    message = _damage_refused(model_copy, target, "it is not a safetensors file (it does not begin with a "
                                                  "safetensors header)")
    (claimed,) = struct.unpack("<Q", target.read_bytes()[:8])
    assert f"{claimed:,}" not in message and str(claimed) not in message


@pytest.mark.parametrize("damage, expected", [
    (lambda data: b"", "it is 0 bytes long, too short for a safetensors file"),
    (lambda data: data + b"\0" * 16, "it has 16 bytes more than its header describes"),
])
def test_empty_or_overlong_safetensors_files_are_refused(model_copy, damage, expected):
    target = _weights(model_copy)
    target.write_bytes(damage(target.read_bytes()))
    _damage_refused(model_copy, target, expected)


def _write_safetensors(path, header: dict, data_bytes: int | None = None):
    raw = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        if data_bytes:
            f.truncate(8 + len(raw) + data_bytes)   # sparse: nothing is written or read


def test_header_entries_that_do_not_match_their_tensor_are_refused(tmp_path):
    bad = tmp_path / "bad.safetensors"
    _write_safetensors(bad, {"w": {"dtype": "F32", "shape": [4, 4], "data_offsets": [0, 32]}}, 32)
    with pytest.raises(WeightFileError, match="tensor 'w' does not match the tensor's shape"):
        read_header(bad)
    _write_safetensors(bad, {"w": {"dtype": "F32", "shape": [4], "data_offsets": [16, 0]}}, 16)
    with pytest.raises(WeightFileError, match="tensor 'w' is malformed"):
        read_header(bad)
    _write_safetensors(bad, [1, 2, 3])
    with pytest.raises(WeightFileError, match="not a JSON object"):
        read_header(bad)


def test_the_check_reads_headers_only(tmp_path):
    big = tmp_path / "big.safetensors"
    size = 512 * 1024 * 1024      # a sparse 512 MB tensor: reading it would be slow and is not needed
    _write_safetensors(big, {"__metadata__": {"format": "pt"},
                             "w": {"dtype": "BF16", "shape": [size // 2], "data_offsets": [0, size]}}, size)
    assert read_header(big)["w"]["shape"] == [size // 2]


def test_a_hub_style_link_names_the_blob_to_delete(model_copy, tmp_path):
    target = _weights(model_copy)
    blob = tmp_path / "blobs" / "0123abcd"
    blob.parent.mkdir()
    data = target.read_bytes()
    blob.write_bytes(data[:-10])
    target.unlink()
    target.symlink_to(blob)
    _damage_refused(model_copy, target, f"stored at {blob}")


def test_a_sharded_component_with_a_missing_shard_is_refused(model_copy):
    target = _weights(model_copy)
    second = "diffusion_pytorch_model-00002-of-00002.safetensors"
    index = {"metadata": {}, "weight_map": {"a": target.name, "b": second}}
    (target.parent / "diffusion_pytorch_model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ModelError, match=r"weight file transformer/diffusion_pytorch_model-00002-of-00002\.safetensors "
                                         r"is missing \(named in .*index.json\); download the model again"):
        check_model_folder(model_copy)


def test_a_component_config_that_is_not_json_is_refused(model_copy):
    (model_copy / "vae" / "config.json").write_text("{ cut short")
    with pytest.raises(ModelError, match=r"vae/config.json is not valid JSON .*download the model again"):
        check_model_folder(model_copy)


# ----- preset files with wrong types -----------------------------------------------------------

def _preset(tmp_path, **changes):
    data = {"name": "odd", "title": "t", "description": "d", "model": "selftest-t2v", "mode": "t2v",
            "width": 64, "height": 64, "frames": 9, "steps": 4, "guidance": 5.0, "shift": 3.0, "fps": 16}
    data.update(changes)
    path = tmp_path / "odd.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("changes, expected", [
    (dict(width=[64]), "field 'width' must be int, got list"),
    (dict(steps=[4, 8]), "field 'steps' must be int, got list"),
    (dict(guidance=[5.0]), "field 'guidance' must be int or float, got list"),
    (dict(shift={"value": 3.0}), "field 'shift' must be int or float, got dict"),
    (dict(frames={"count": 9}), "field 'frames' must be int, got dict"),
    (dict(width=64.0), "field 'width' must be int, got float"),
    (dict(negative_prompt={"text": "blurry"}), "field 'negative_prompt' must be str, got dict"),
    (dict(sigmas=[[1.0], [0.7], [0.5], [0.2]]), "'sigmas' must be a list of numbers between 0 and 1"),
    (dict(extra={"nested": {"deep": 1}}), "unknown field(s) extra"),
    (dict(fps=None), "field 'fps' must be int, got NoneType"),
])
def test_a_preset_with_a_wrong_type_or_nested_object_is_refused(tmp_path, changes, expected):
    with pytest.raises(PresetError) as info:
        load_preset_file(_preset(tmp_path, **changes))
    assert str(info.value).startswith("odd.json:") and expected in str(info.value)


def test_a_preset_file_holding_a_list_is_refused(tmp_path):
    path = tmp_path / "odd.json"
    path.write_text("[1, 2, 3]")
    with pytest.raises(PresetError, match="odd.json: a preset must be a JSON object, got list"):
        load_preset_file(path)


def test_an_operator_missing_on_this_device_reads_as_one_short_sentence():
    """torch's "operator not available" errors list every dispatch key (pages); the page shows the first part."""
    import torch

    from engine.run.failures import MAX_ERROR_CHARS, failure_event

    q = torch.zeros(1, 2, 4, 8)
    with pytest.raises(NotImplementedError) as info:
        torch.ops.aten._scaled_dot_product_flash_attention(q, q, q)
    assert len(str(info.value)) > 2000
    event = failure_event("job", info.value, "denoise")
    assert event.kind == "runtime" and "during denoise" in event.message
    assert "_scaled_dot_product_flash_attention" in event.message and "'CPU' backend" in event.message
    assert len(event.message) < MAX_ERROR_CHARS + 80 and "registered at" not in event.message


def test_a_sentence_keeps_a_name_it_starts_with_as_written():
    from engine.words import sentence

    assert sentence("notes.png is not saved latents") == "notes.png is not saved latents."
    assert sentence("selftest-t2v is a text-to-video model") == "selftest-t2v is a text-to-video model."
    assert sentence("Wan-AI/Wan2.1 x") == "Wan-AI/Wan2.1 x."
    assert sentence("image-to-video needs an image") == "Image-to-video needs an image."
    assert sentence("width 70 is not a multiple of 16") == "Width 70 is not a multiple of 16."
