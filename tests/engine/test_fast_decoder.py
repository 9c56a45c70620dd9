"""The fast video decoder: random weights in the published TAEHV layout, saved as the real files are, read,
checked and decoded on the CPU (the real files are not downloaded; their layout is what matters here)."""
from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F

from engine.models.fast_decoder_file import (
    FastDecoderError,
    check_matches,
    find_fast_decoder,
    random_fast_decoder_state,
    read_fast_decoder,
    write_fast_decoder,
)
from engine.run.fast_decoder import load_fast_decoder

H, W = 2, 3  # latent pixels: frames of 16 x 24 (8x), or 32 x 48 with 2x2 patches
# The time strides of decoder.7, .13 and .19 in every real file (taehv.py: TGrow(n_f[0], 1), then 2, 2).
REAL_STRIDES = (1, 2, 2)


def _latents(channels: int, frames: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(1, channels, frames, H, W, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """These tensors are tiny: threads cost more than they bring, and on a busy machine OpenMP's waiting
    threads make a decode many times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def z16_state() -> dict:
    return random_fast_decoder_state(latent_channels=16, patch_size=1, seed=0)


@pytest.fixture(scope="module")
def files(tmp_path_factory, z16_state) -> dict:
    """The 16-channel decoder as .safetensors and as a .pth nesting it under "state_dict" (both forms are
    published), and a 48-channel, 2x2-patch one."""
    folder = tmp_path_factory.mktemp("fast_decoders")
    torch.save({"state_dict": z16_state}, folder / "taew2_1.pth")
    return {"safetensors": write_fast_decoder(folder / "taew2_1.safetensors", z16_state),
            "pth": folder / "taew2_1.pth",
            "z48": write_fast_decoder(folder / "taew2_2.safetensors", random_fast_decoder_state(48, 2, seed=3))}


@pytest.fixture(scope="module")
def decoders(files) -> dict:
    """Each file loaded once, on the CPU in float32."""
    return {form: load_fast_decoder(path, "cpu", torch.float32) for form, path in files.items()}


@pytest.fixture(scope="module")
def z16(decoders):
    return decoders["safetensors"]


@pytest.mark.parametrize("form", ["safetensors", "pth"])
def test_the_layout_is_read_from_the_weights(files, z16_state, form):
    info, state = read_fast_decoder(files[form])
    assert (info.name, info.latent_channels, info.patch_size, info.time_strides) == ("taew2_1", 16, 1, REAL_STRIDES)
    assert not info.vae_space_latents
    assert set(state) == {key for key in z16_state if key.startswith("decoder.")}  # the encoder is left out
    assert info.parameters == sum(t.numel() for t in state.values())
    assert 9_000_000 < info.parameters < 11_000_000
    assert [info.frames_out(t) for t in (1, 2, 21)] == [1, 5, 81]


@pytest.mark.parametrize("form", ["safetensors", "pth"])
@pytest.mark.parametrize("latent_frames", [1, 2, 6])
def test_16_channel_latents_decode_to_4k_plus_1_frames(decoders, form, latent_frames):
    frames = decoders[form].decode(_latents(16, latent_frames))
    assert frames.shape == (4 * latent_frames - 3, 8 * H, 8 * W, 3)
    assert frames.dtype == torch.uint8 and frames.device.type == "cpu"


@contextlib.contextmanager
def batch_independent_convs():
    """Convs whose result for a frame does not depend on how many frames share its batch: PyTorch's reference
    kernels on one thread. (oneDNN and NNPACK choose their algorithm by batch size, and a multi-threaded GEMM
    splits its work by it, so a chunk's frames may round differently in the last bit from the same frames
    decoded all at once.)"""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.backends.mkldnn.flags(enabled=False), torch.backends.nnpack.flags(enabled=False):
            yield
    finally:
        torch.set_num_threads(threads)


def _taehv_reference(state: dict, latents: torch.Tensor, time_strides=REAL_STRIDES, patch_size: int = 1):
    """taehv.py's decoder (madebyollin/taehv: TAEHV.decode_video, parallel), written out here with
    torch.nn.functional from the tensors: the time strides are the ones given, not read from the weights
    (a TGrow weight of another stride is a shape error). (1, C, T, h, w) -> uint8 frames, as decode gives."""
    def conv(x, index):
        return F.conv2d(x, state[f"decoder.{index}.weight"], state.get(f"decoder.{index}.bias"), padding=1)

    def memblock(x, index):  # its input beside the input of the frame before (zeros before the first)
        past = F.pad(x, (0, 0, 0, 0, 0, 0, 1, 0))[:x.shape[0]]
        inner = torch.cat([x, past], 1)
        for i in (0, 2, 4):
            inner = F.conv2d(inner, state[f"decoder.{index}.conv.{i}.weight"],
                             state[f"decoder.{index}.conv.{i}.bias"], padding=1)
            inner = F.relu(inner) if i < 4 else inner
        return F.relu(inner + x)

    x = latents[0].transpose(0, 1)  # (T, C, h, w): the frames as one batch of images
    x = F.relu(conv(torch.tanh(x / 3) * 3, 1))
    index = 3
    for stride in time_strides:
        for _ in range(3):
            x, index = memblock(x, index), index + 1
        x, index = F.interpolate(x, scale_factor=2, mode="nearest"), index + 1
        n, c, h, w = x.shape
        x = F.conv2d(x, state[f"decoder.{index}.conv.weight"]).reshape(n * stride, c, h, w)  # TGrow
        x = conv(x, index + 1)
        index += 2
    x = conv(F.relu(x), index + 1).clamp(0, 1)  # decoder.21 is the ReLU
    if patch_size > 1:
        x = F.pixel_shuffle(x, patch_size)
    frames_to_trim = 2 ** sum(stride == 2 for stride in time_strides) - 1
    return (x[frames_to_trim:] * 255 + 0.5).to(torch.uint8).permute(0, 2, 3, 1)


@pytest.mark.parametrize("latent_frames", [1, 2, 5, 21])
def test_the_real_stride_order_decodes_as_taehv_does(z16_state, z16, latent_frames):
    """With the real (1, 2, 2) the MemBlocks of the second stage see the latent frames, those of the third
    twice as many: a decoder that put the strides in another order would give other frames."""
    latents = _latents(16, latent_frames, seed=latent_frames)
    with batch_independent_convs():
        frames = z16.decode(latents)
        reference = _taehv_reference(z16_state, latents)
    assert frames.shape == (4 * (latent_frames - 1) + 1, 8 * H, 8 * W, 3)
    assert z16.info.frames_out(latent_frames) == frames.shape[0]
    assert torch.equal(frames, reference)


def test_2x2_patches_decode_as_taehv_does(files, decoders):
    from safetensors.torch import load_file

    decoder, state = decoders["z48"], load_file(files["z48"])
    latents = _latents(48, 5)
    with batch_independent_convs():
        frames = decoder.decode(latents)
        assert torch.equal(frames, _taehv_reference(state, latents, patch_size=2))
    assert frames.shape == (17, 16 * H, 16 * W, 3)


def test_the_strides_come_from_the_weights_in_their_order(tmp_path):
    """An order no published file has, (2, 2, 1): read as it is stored and applied so, not as (1, 2, 2)."""
    state = random_fast_decoder_state(16, 1, seed=4, time_strides=(2, 2, 1))
    decoder = load_fast_decoder(write_fast_decoder(tmp_path / "taew2_1.safetensors", state), "cpu")
    assert decoder.info.time_strides == (2, 2, 1) and decoder.info.frames_out(5) == 17
    latents = _latents(16, 5)
    with batch_independent_convs():
        frames = decoder.decode(latents)
        assert torch.equal(frames, _taehv_reference(state, latents, time_strides=(2, 2, 1)))
        assert torch.equal(torch.cat(list(decoder.stream(latents, chunk=2))), frames)
    with pytest.raises(RuntimeError):  # the real order does not fit these weights
        _taehv_reference(state, latents)
    with pytest.raises(ValueError, match=r"time strides \(2, 2\): give one of 1 or more per TGrow \(3\)"):
        random_fast_decoder_state(time_strides=(2, 2))


def test_48_channel_latents_decode_through_2x2_patches(files):
    decoder = load_fast_decoder(files["z48"], "cpu")  # the dtype left to it: float32 on the CPU
    assert (decoder.info.latent_channels, decoder.info.patch_size, decoder.dtype) == (48, 2, torch.float32)
    frames = decoder.decode(_latents(48, 2))
    assert frames.shape == (5, 16 * H, 16 * W, 3) and frames.dtype == torch.uint8


def test_the_frames_are_pictures_not_a_constant(z16):
    frames = z16.decode(_latents(16, 2)).int()
    assert frames.unique().numel() > 20
    assert (frames[0] != frames[-1]).any()  # time reaches the frames: they are not all alike


@pytest.mark.parametrize("chunk", [1, 2, 5])
def test_streaming_gives_exactly_what_one_decode_gives(z16, chunk):
    latents = _latents(16, 6)
    with batch_independent_convs():
        batches = list(z16.stream(latents, chunk=chunk))
        whole = z16.decode(latents)
    sizes = [4 * min(chunk, 6 - start) for start in range(0, 6, chunk)]
    assert [b.shape[0] for b in batches] == [sizes[0] - 3] + sizes[1:]  # the warm-up frames leave the first only
    assert torch.equal(torch.cat(batches), whole)


def test_streaming_with_the_fast_convs_differs_at_most_by_a_rounding(z16):
    latents = _latents(16, 6)
    streamed, whole = torch.cat(list(z16.stream(latents, chunk=1))).int(), z16.decode(latents).int()
    assert (streamed - whole).abs().max() <= 1
    assert (streamed != whole).float().mean() < 0.001


def test_streaming_2x2_patches_gives_exactly_what_one_decode_gives(decoders):
    decoder = decoders["z48"]
    latents = _latents(48, 3)
    with batch_independent_convs():
        assert torch.equal(torch.cat(list(decoder.stream(latents, chunk=1))), decoder.decode(latents))


def test_a_file_without_the_last_conv_bias_is_refused(tmp_path, z16_state):
    path = write_fast_decoder(tmp_path / "taew2_1.safetensors",
                              {k: v for k, v in z16_state.items() if k != "decoder.22.bias"})
    with pytest.raises(FastDecoderError, match=r"not a TAEHV video decoder \(it has no key decoder\.22\.bias"):
        read_fast_decoder(path)


def test_an_encoder_only_file_is_refused(tmp_path):
    path = write_fast_decoder(tmp_path / "taew2_1_encoder.safetensors", {"encoder.0.weight": torch.zeros(64, 3, 3, 3)})
    with pytest.raises(FastDecoderError, match=r"not a TAEHV video decoder .*decoder\.22\.bias.*: use taew2_1"):
        load_fast_decoder(path)


def test_a_conv_of_the_wrong_shape_or_a_stray_key_is_named(tmp_path, z16_state):
    state = dict(z16_state, **{"decoder.8.weight": torch.zeros(128, 128, 3, 3)})
    with pytest.raises(FastDecoderError, match=r"decoder\.8\.weight has shape \[128, 128, 3, 3\] where "
                                               r"\[128, 256, 3, 3\] fits"):
        read_fast_decoder(write_fast_decoder(tmp_path / "taew2_1.safetensors", state))
    state = dict(z16_state, **{"decoder.2.weight": torch.zeros(1)})
    with pytest.raises(FastDecoderError, match=r"it has a key decoder\.2\.weight that no TAEHV decoder has"):
        read_fast_decoder(write_fast_decoder(tmp_path / "taew2_1.safetensors", state))


def test_a_missing_file_says_what_to_put_there(tmp_path):
    with pytest.raises(FastDecoderError, match="there is no fast decoder file at .*: put taew2_1.safetensors"):
        read_fast_decoder(tmp_path / "fast_decoders" / "taew2_1.safetensors")


def test_an_identity_skip_conv_is_accepted_and_changes_nothing(tmp_path, z16_state, z16):
    state = dict(z16_state, **{"decoder.3.skip.weight": torch.eye(256).view(256, 256, 1, 1)})
    decoder = load_fast_decoder(write_fast_decoder(tmp_path / "taew2_1.safetensors", state), "cpu")
    latents = _latents(16, 2)
    assert torch.equal(decoder.decode(latents), z16.decode(latents))


def test_a_decoder_for_other_latents_is_refused(files, z16):
    info, _ = read_fast_decoder(files["z48"])
    check_matches(info, 48)
    with pytest.raises(FastDecoderError, match=r"^this decoder \(taew2_2\) takes 48-channel latents \(Wan2\.2-5B\); "
                                               r"the model makes 16-channel latents: use taew2_1$"):
        check_matches(info, 16)
    with pytest.raises(FastDecoderError, match=r"takes 16-channel latents .*; the model makes 48-channel latents: "
                                               r"use taew2_2"):
        z16.decode(_latents(48, 1))


def test_a_vae_space_decoder_denormalises_the_latents(tmp_path, z16_state, z16):
    light = load_fast_decoder(write_fast_decoder(tmp_path / "lighttaew2_1.safetensors", z16_state), "cpu")
    assert light.info.vae_space_latents and light.info.name == "lighttaew2_1"
    generator = torch.Generator().manual_seed(5)
    mean, std = torch.randn(16, generator=generator).tolist(), (torch.rand(16, generator=generator) * 2 + 0.5).tolist()
    latents = _latents(16, 2)
    with pytest.raises(FastDecoderError, match="takes the VAE's own latents: pass latents_mean and latents_std"):
        light.decode(latents)
    frames = light.decode(latents, latents_mean=mean, latents_std=std)
    assert not torch.equal(frames, z16.decode(latents))
    vae_space = latents * torch.tensor(std).view(1, 16, 1, 1, 1) + torch.tensor(mean).view(1, 16, 1, 1, 1)
    assert torch.equal(frames, z16.decode(vae_space))
    streamed = torch.cat(list(light.stream(latents, chunk=1, latents_mean=mean, latents_std=std)))
    assert torch.equal(streamed, frames)


def test_the_latent_space_can_be_named_against_the_file_name(files):
    assert load_fast_decoder(files["safetensors"], "cpu", vae_space_latents=True).info.vae_space_latents
    info, _ = read_fast_decoder(files["z48"], vae_space_latents=False)
    assert not info.vae_space_latents


def test_the_decoder_for_the_model_is_found_taew_first(tmp_path):
    folder = tmp_path / "fast_decoders"
    folder.mkdir()
    assert find_fast_decoder(tmp_path, 16) is None
    (folder / "lighttaew2_1.pth").touch()
    (folder / "taew2_2.safetensors").touch()
    assert find_fast_decoder(tmp_path, 16) == folder / "lighttaew2_1.pth"
    (folder / "taew2_1.pth").touch()
    assert find_fast_decoder(tmp_path, 16) == folder / "taew2_1.pth"
    (folder / "taew2_1.safetensors").touch()
    assert find_fast_decoder(tmp_path, 16) == folder / "taew2_1.safetensors"
    assert find_fast_decoder(tmp_path, 48) == folder / "taew2_2.safetensors"
    assert find_fast_decoder(tmp_path, 32) is None


def test_frames_that_overflow_are_refused_not_written_black(tmp_path, z16_state):
    """Finite weights, each enormous: the frames come out infinite, which a video would show as black."""
    from engine.run.nonfinite import NonFiniteValues

    huge = {key: torch.full_like(value, 1e30) for key, value in z16_state.items()}
    decoder = load_fast_decoder(write_fast_decoder(tmp_path / "taew2_1.safetensors", huge), "cpu")
    with pytest.raises(NonFiniteValues, match=r"^The fast decoder produced infinite values \(in 100% "
                                              r"of the frames' pixels\), so the video would be black$"):
        decoder.decode(_latents(16, 1))
    with pytest.raises(NonFiniteValues):
        next(decoder.stream(_latents(16, 2), chunk=1))
