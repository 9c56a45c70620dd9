"""RIFE frame interpolation: random weights in the published v4.7 layout (the layout of rife47.pth and
rife49.pth, ComfyUI-Frame-Interpolation's default), saved as the real files are, read, checked and run on the
CPU (the real files are not downloaded; their layout is what matters here)."""
from __future__ import annotations

import pytest
import torch

from engine.post.rife import (RIFE_SUFFIXES, V4_6, V4_7, build_ifnet, expected_shapes, find_rife, load_rife,
                              write_random_rife)
from tests.conftest import one_torch_thread


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """These frames are tiny: threads cost more than they bring, and on a busy machine OpenMP's waiting threads
    make a frame many times slower (1 s instead of 30 ms measured)."""
    with one_torch_thread():
        yield


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    return write_random_rife(tmp_path_factory.mktemp("interpolators") / "rife47.pth", seed=0)


@pytest.fixture(scope="module")
def rife(weights):
    return load_rife(weights)


def _frames(height: int, width: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(1, 3, height, width, generator=generator), torch.rand(1, 3, height, width, generator=generator)


def test_a_written_file_loads_and_makes_a_frame_of_the_same_size_in_range(rife):
    a, b = _frames(32, 48, seed=1)
    out = rife.between(a, b, 0.5)
    assert out.shape == a.shape and out.dtype == torch.float32
    assert torch.isfinite(out).all() and out.min() >= 0 and out.max() <= 1
    assert rife.name == "RIFE 4.7-4.9 (rife47.pth)"


def test_sizes_that_are_no_multiple_of_32_are_padded_and_cropped_back(rife):
    for height, width in ((30, 50), (17, 33)):
        a, b = _frames(height, width, seed=2)
        out = rife.between(a, b, 0.25)
        assert out.shape == (1, 3, height, width)
        assert torch.isfinite(out).all() and out.min() >= 0 and out.max() <= 1


def test_a_frame_between_two_equal_flat_frames_is_that_frame(rife):
    """Whatever the flows, warping a flat frame gives it back and the mask blends it with itself (at a size that
    needs no padding: the padding's black would be warped in at the edges)."""
    a = torch.full((2, 3, 64, 128), 0.3)
    assert torch.allclose(rife.between(a, a.clone(), 0.5), a, atol=1e-5)


def test_the_written_file_has_exactly_the_networks_keys_and_shapes(weights):
    state = torch.load(weights, weights_only=True)
    network = {key: tuple(value.shape) for key, value in build_ifnet(V4_7).state_dict().items()}
    assert {key: tuple(value.shape) for key, value in state.items()} == network == expected_shapes(V4_7)


def test_the_layout_has_the_published_key_names_and_shapes():
    """Read from IFNet_HDv3 of v4.7 (ComfyUI-Frame-Interpolation's rife_arch.py, arch_ver "4.7"; vs-rife's
    IFNet_HDv3_v4_7.py): block0 takes 3 + 3 + 2 * 4 features + 1 time channels, the others 4 + 1 + 4 more."""
    shapes = expected_shapes(V4_7)
    assert len(shapes) == 124
    assert shapes["block0.conv0.0.0.weight"] == (96, 15, 3, 3)
    assert shapes["block1.conv0.0.0.weight"] == (64, 20, 3, 3)
    assert shapes["block0.convblock.7.beta"] == (1, 192, 1, 1)
    assert shapes["block0.convblock.0.conv.weight"] == (192, 192, 3, 3)
    assert shapes["block3.lastconv.0.weight"] == (64, 24, 4, 4)
    assert shapes["encode.0.weight"] == (16, 3, 3, 3)
    assert shapes["encode.1.weight"] == (16, 4, 4, 4)
    assert expected_shapes(V4_6)["block0.conv0.0.0.weight"] == (96, 7, 3, 3)
    assert not any(key.startswith("encode.") for key in expected_shapes(V4_6))


def test_a_file_with_module_prefixes_loads_too(tmp_path, weights, rife):
    """Practical-RIFE's flownet.pkl keeps its keys under "module." (saved from DistributedDataParallel)."""
    state = torch.load(weights, weights_only=True)
    path = tmp_path / "flownet.pkl"
    torch.save({f"module.{key}": value for key, value in state.items()}, path)
    a, b = _frames(32, 48, seed=3)
    assert torch.equal(load_rife(path).between(a, b, 0.5), rife.between(a, b, 0.5))


def test_a_safetensors_copy_loads_too(tmp_path, weights, rife):
    from safetensors.torch import save_file

    path = tmp_path / "rife47.safetensors"
    save_file(torch.load(weights, weights_only=True), str(path))
    a, b = _frames(32, 48, seed=4)
    assert torch.equal(load_rife(path).between(a, b, 0.5), rife.between(a, b, 0.5))


def test_the_v4_6_layout_loads_and_runs(tmp_path):
    loaded = load_rife(write_random_rife(tmp_path / "interpolators" / "flownet.pkl", seed=5, layout=V4_6))
    assert loaded.name == "RIFE 4.6 (flownet.pkl)"
    a, b = _frames(30, 50, seed=6)
    out = loaded.between(a, b, 0.5)
    assert out.shape == a.shape and torch.isfinite(out).all()


def test_a_file_of_another_layout_is_refused_naming_it(tmp_path, weights):
    state = torch.load(weights, weights_only=True)
    state["block0.conv0.0.1.weight"] = torch.zeros(96)   # a PReLU, as v4.0's blocks have
    path = tmp_path / "interpolators" / "rife40.pth"
    path.parent.mkdir()
    torch.save(state, path)
    with pytest.raises(ValueError, match=r"interpolators/rife40\.pth is not a RIFE 4\.x file.*block0\.conv0\.0\.1"):
        load_rife(path)
    del state["block0.conv0.0.1.weight"]
    state["block0.conv0.0.0.weight"] = torch.zeros(96, 23, 3, 3)   # v4.10's 16 feature channels
    torch.save(state, path)
    with pytest.raises(ValueError, match=r"rife40\.pth .*block0\.conv0\.0\.0\.weight has shape \[96, 23, 3, 3\]"):
        load_rife(path)


def test_a_file_that_is_no_weights_or_holds_nan_is_refused_naming_it(tmp_path, weights):
    broken = tmp_path / "broken.pth"
    broken.write_bytes(b"\x8f not a pickle")
    with pytest.raises(ValueError, match=r"broken\.pth could not be read as RIFE weights: .*\(\w+\)"):
        load_rife(broken)
    state = torch.load(weights, weights_only=True)
    state["encode.0.bias"] = torch.full((16,), float("nan"))
    damaged = tmp_path / "damaged.pth"
    torch.save(state, damaged)
    with pytest.raises(ValueError, match=r"damaged\.pth holds NaN"):
        load_rife(damaged)
    with pytest.raises(ValueError, match="no RIFE weights file"):
        load_rife(tmp_path / "missing.pth")


def test_frames_of_other_shapes_or_a_time_outside_0_1_are_refused(rife):
    a, b = _frames(32, 48, seed=7)
    with pytest.raises(ValueError, match="same"):
        rife.between(a, b[:, :, :16], 0.5)
    with pytest.raises(ValueError, match="0 < t < 1"):
        rife.between(a, b, 1.0)


def test_bfloat16_stays_close_to_float32(weights, rife):
    """The sampling positions stay float32 inside, so a low-precision network still warps to the right pixels."""
    half = load_rife(weights, dtype=torch.bfloat16)
    a, b = _frames(32, 48, seed=8)
    out = half.between(a.bfloat16(), b.bfloat16(), 0.5)
    assert out.dtype == torch.bfloat16
    assert (out.float() - rife.between(a, b, 0.5)).abs().mean() < 0.02


def test_find_rife_takes_the_first_file_by_name_and_none_without_one(tmp_path):
    assert find_rife(tmp_path / "missing") is None
    folder = tmp_path / "interpolators"
    folder.mkdir()
    assert find_rife(folder) is None
    (folder / "notes.txt").write_text("not weights")
    (folder / "zz.pth").write_bytes(b"")
    (folder / "rife49.safetensors").write_bytes(b"")
    (folder / "rife47.pkl").mkdir()   # a folder with a weights suffix is no file
    (folder / ".rife49.partial.pth").write_bytes(b"")   # hidden: a file being written, or a fetch's
    assert find_rife(folder) == folder / "rife49.safetensors"
    assert set(RIFE_SUFFIXES) == {".pth", ".pkl", ".safetensors", ".ckpt"}
