"""The Image to Video tab's view of the first frame: the crop the model starts from, and the aspect button."""
from __future__ import annotations

import pytest
from PIL import Image

from engine.settings.images import size_for_aspect
from ui.tabs.image_to_video import NO_IMAGE, crop_preview


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
    assert crop_preview(None, 96, 64) == (None, NO_IMAGE) and NO_IMAGE.startswith("Upload a first frame")
    image = tmp_path / "ok.png"
    Image.new("RGB", (64, 64)).save(image)
    fitted, note = crop_preview(str(image), 100, 64)
    assert fitted is None and "multiples of 16" in note
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not an image")
    fitted, note = crop_preview(str(broken), 96, 64)
    assert fitted is None and note.startswith("**Cannot use this image:**")


def test_a_video_to_extend_gives_the_start_its_last_frame_and_says_the_total(tmp_path):
    import numpy as np

    from engine.outputs.export import write_mp4

    frames = np.zeros((9, 48, 64, 3), np.uint8)
    frames[-1] = (10, 200, 30)   # the last frame green: what the new part starts from
    video = write_mp4(frames, tmp_path / "walk.mp4", 16)
    image, note = crop_preview(None, 96, 64, str(video), 5)
    assert image.size == (96, 64) and abs(np.asarray(image)[32, 48].astype(int) - (10, 200, 30)).max() < 20
    assert "Extending walk.mp4" in note and "9 frames and 4 new, 13 frames" in note
    assert crop_preview(None, 97, 64, str(video), 5)[1].startswith("**Size:** 97x64 cannot be used")
    (tmp_path / "not.mp4").write_text("text")
    assert crop_preview(None, 96, 64, str(tmp_path / "not.mp4"), 5)[1].startswith("**Cannot extend this video:**")
