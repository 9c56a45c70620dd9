"""The Image to Video tab's view of the first frame: the crop the model starts from, and the aspect button."""
from __future__ import annotations

import pytest
from PIL import Image

from engine.settings.images import size_for_aspect
from ui.tabs.image_to_video import crop_preview


@pytest.mark.parametrize("image, size, expected", [
    ((1920, 1080), (832, 480), (848, 480)),     # 16:9 at about 832x480's pixel count
    ((1080, 1920), (832, 480), (480, 848)),     # portrait: the sides swap
    ((1000, 1000), (832, 480), (624, 624)),
    ((8000, 10), (832, 480), (2048, 32)),       # clamped to the sides the app allows
])
def test_the_image_aspect_at_about_the_same_pixels_in_multiples_of_16(image, size, expected):
    width, height = size_for_aspect(image, *size)
    assert (width, height) == expected
    assert width % 16 == 0 and height % 16 == 0


def test_the_preview_is_the_exact_crop_with_its_final_size(tmp_path):
    path = tmp_path / "wide.png"
    picture = Image.new("RGB", (300, 100), (255, 0, 0))
    picture.paste((0, 0, 255), (100, 0, 200, 100))   # blue middle third
    picture.save(path)
    fitted, note = crop_preview(str(path), 96, 64)
    assert fitted.size == (96, 64)
    assert fitted.getpixel((48, 32))[2] > 200 and fitted.getpixel((2, 32))[0] > 200   # centre kept, sides cut
    assert "**Final size: 96x64** (from 300x100" in note and "cropped away" in note


def test_the_preview_explains_a_size_or_an_image_it_cannot_use(tmp_path):
    assert crop_preview(None, 96, 64) == (None, "Upload a first frame to see it at the video's size.")
    image = tmp_path / "ok.png"
    Image.new("RGB", (64, 64)).save(image)
    fitted, note = crop_preview(str(image), 100, 64)
    assert fitted is None and "multiples of 16" in note
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not an image")
    fitted, note = crop_preview(str(broken), 96, 64)
    assert fitted is None and note.startswith("**Cannot use this image:**")
