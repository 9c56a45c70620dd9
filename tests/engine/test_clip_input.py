"""The image encoder sees the whole frame squashed to its square, as the official Wan code makes it (bicubic, no
crop), not diffusers' CLIPImageProcessor output (shortest side resized, then centre-cropped)."""
from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from engine.events import JobFinished
from engine.run.clip_input import CLIP_MEAN, CLIP_STD, clip_pixel_values, encoder_square
from engine.run.engine import Engine
from engine.settings.images import fit_image
from tests.conftest import CPU, run_engine, tiny_request

# Edge stripes as wide as these columns: a centre crop of a 4:3 or wider frame drops all of them.
EDGE = 4


def official_pixels(image: Image.Image, size: int, mean=CLIP_MEAN, std=CLIP_STD) -> torch.Tensor:
    """Official Wan's steps (wan/modules/clip.py, CLIPModel.visual), written out: TF.to_tensor, to [-1, 1], a
    bicubic interpolation of the whole frame (align_corners False), back to [0, 1], Normalize: (1, 3, size, size)."""
    u = torch.tensor(np.array(image), dtype=torch.uint8).permute(2, 0, 1).float().div(255)   # TF.to_tensor
    u = u.sub_(0.5).div_(0.5)[:, None, :, :]                                                   # (C, 1, H, W)
    u = F.interpolate(u.transpose(0, 1), size=(size, size), mode="bicubic", align_corners=False)
    u = u.mul_(0.5).add_(0.5)
    return (u - torch.tensor(mean)[:, None, None]) / torch.tensor(std)[:, None, None]


def striped(width: int, height: int, seed: int = 0) -> Image.Image:
    """Noise in the middle, a green stripe on the left edge and a yellow one on the right (EDGE columns each)."""
    values = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    values[:, :EDGE] = (20, 220, 40)
    values[:, -EDGE:] = (230, 210, 20)
    return Image.fromarray(values, "RGB")


def wan_processor():
    """The CLIPImageProcessor of Wan's published image_processor/preprocessor_config.json."""
    from transformers import CLIPImageProcessor

    return CLIPImageProcessor(size={"shortest_edge": 224}, crop_size={"height": 224, "width": 224}, resample=3,
                              do_center_crop=True, image_mean=list(CLIP_MEAN), image_std=list(CLIP_STD))


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b||."""
    return float((a.float() - b.float()).norm() / b.float().norm())


def test_the_pixel_values_are_the_official_whole_frame_not_diffusers_centre_crop():
    image, processor = striped(832, 480), wan_processor()
    ours = clip_pixel_values([image], 224, processor)
    assert ours.shape == (1, 3, 224, 224) and ours.dtype == torch.float32
    torch.testing.assert_close(ours, official_pixels(image, 224), atol=1e-6, rtol=0)
    cropped = processor(images=image, return_tensors="pt").pixel_values
    assert cropped.shape == ours.shape
    # The crop keeps the middle 224 of 388 columns: the stripes at both edges are gone from its input.
    green = (torch.tensor([20, 220, 40]) / 255 - torch.tensor(CLIP_MEAN)) / torch.tensor(CLIP_STD)
    yellow = (torch.tensor([230, 210, 20]) / 255 - torch.tensor(CLIP_MEAN)) / torch.tensor(CLIP_STD)
    assert (ours[0, :, :, 0].mean(1) - green).abs().max() < 0.05
    assert (ours[0, :, :, -1].mean(1) - yellow).abs().max() < 0.05
    assert (cropped[0, :, :, 0].mean(1) - green).abs().max() > 0.5
    assert (cropped[0, :, :, -1].mean(1) - yellow).abs().max() > 0.5
    gap = relative(cropped, ours)
    print(f"\nCLIP pixel values, 832x480 frame: centre crop vs official resize, relative difference {gap:.3f}, "
          f"mean absolute difference {float((cropped - ours).abs().mean()):.3f}")
    assert gap > 0.3


def test_two_frames_are_encoded_each_whole_in_one_batch():
    first, last = striped(832, 480, seed=1), striped(480, 832, seed=2)
    both = clip_pixel_values([first, last], 224, wan_processor())
    assert both.shape == (2, 3, 224, 224)
    torch.testing.assert_close(both[1:], official_pixels(last, 224), atol=1e-6, rtol=0)


def test_the_square_is_the_encoders_own():
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModel

    encoder = CLIPVisionModel(CLIPVisionConfig(hidden_size=4, intermediate_size=8, num_hidden_layers=1,
                                               num_attention_heads=2, image_size=24, patch_size=4))
    assert encoder_square(encoder, CLIPImageProcessor()) == 24
    assert encoder_square(object(), CLIPImageProcessor(crop_size=40)) == 40


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    engine = Engine(tmp_path_factory.mktemp("clip-models"), CPU)
    yield engine
    engine.unload()


@pytest.fixture
def image_embeds_seen(monkeypatch) -> list:
    """Every ``encoder_hidden_states_image`` the Wan transformer is called with, while the test runs."""
    from diffusers import WanTransformer3DModel

    seen, forward = [], WanTransformer3DModel.forward

    @functools.wraps(forward)
    def recording(self, *args, **kwargs):
        seen.append(kwargs.get("encoder_hidden_states_image"))
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(WanTransformer3DModel, "forward", recording)
    return seen


def expected_embeds(pipe, frames: list) -> torch.Tensor:
    """The penultimate hidden states of ``pipe``'s image encoder on the official pixels of ``frames``."""
    size = pipe.image_encoder.config.image_size
    pixels = torch.cat([official_pixels(frame, size, pipe.image_processor.image_mean,
                                          pipe.image_processor.image_std) for frame in frames])
    with torch.inference_mode():
        return pipe.image_encoder(pixel_values=pixels, output_hidden_states=True).hidden_states[-2]


def check_seen(seen: list, expected: torch.Tensor) -> None:
    """Every transformer call got ``expected`` (in its dtype; the encoder's float32 arithmetic may round apart by
    about 1e-6 in the engine's process settings, far below what the centre crop changes)."""
    assert seen and all(embeds is not None for embeds in seen)
    for embeds in seen:
        torch.testing.assert_close(embeds, expected.to(embeds.dtype), atol=1e-5, rtol=1e-5)


def test_image_to_video_conditions_on_the_official_encoding(engine, model_dirs, presets, outputs, tmp_path,
                                                             image_embeds_seen):
    path = tmp_path / "striped.png"
    striped(64, 48).save(path)
    request = tiny_request(presets, model_dirs["tiny-i2v"], outputs, mode="i2v", image=str(path), width=64,
                           height=48, frames=5, steps=2)
    result, _ = run_engine(engine, request)
    assert isinstance(result, JobFinished), result
    pipe = engine.loaded.pipe
    frame = fit_image(path, 64, 48)
    expected = expected_embeds(pipe, [frame])
    assert expected.shape == (1, 32 * 32 + 1, 4)
    check_seen(image_embeds_seen, expected)
    with torch.inference_mode():
        cropped = pipe.encode_image(frame, "cpu")   # diffusers' own: CLIPImageProcessor's centre crop
    gap = relative(cropped, expected)
    print(f"\nself-test image encoder, 64x48 frame: centre-crop embeddings vs official-resize embeddings, "
          f"relative difference {gap:.4f}")
    assert gap > 1e-3


def test_first_and_last_frame_encodes_both_frames_the_official_way(engine, presets, outputs, tmp_path,
                                                                    image_embeds_seen):
    from engine.models.selftest import SELFTEST_I2V, build_selftest_pipeline

    flf = tmp_path / "tiny-flf2v"
    build_selftest_pipeline(SELFTEST_I2V, first_last=True).save_pretrained(flf)
    first, last = tmp_path / "first.png", tmp_path / "last.png"
    striped(80, 60, seed=1).save(first)
    striped(64, 48, seed=2).save(last)
    request = tiny_request(presets, flf, outputs, mode="i2v", image=str(first), last_image=str(last), width=64,
                           height=48, frames=5, steps=2)
    result, _ = run_engine(engine, request)
    assert isinstance(result, JobFinished), result
    frames = [fit_image(first, 64, 48), fit_image(last, 64, 48, name="last image")]
    expected = expected_embeds(engine.loaded.pipe, frames)
    assert expected.shape == (2, 32 * 32 + 1, 4)
    check_seen(image_embeds_seen, expected)
