"""Upscaling frames: tiny random ESRGAN files read by spandrel, tiled and whole; Lanczos when there is no model."""
from __future__ import annotations

import importlib
import sys

import numpy as np
import pytest
import torch

import engine.post.upscale as upscale_module
from engine.errors import ModelError
from engine.post.upscale import (
    MIN_TILE,
    Upscaler,
    find_upscaler,
    lanczos,
    load_upscaler,
    tile_spans,
    torchvision_placeholders,
    write_random_esrgan,
)
from tests.conftest import one_torch_thread


def _torchvision_imports() -> bool:
    try:
        import torchvision  # noqa: F401
    except Exception:
        return False
    return True


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models run in many tiny operations: on a busy machine, more torch threads only wait on each other
    (the tiling test took 47 s with two threads beside another suite, half a second with one)."""
    with one_torch_thread():
        yield


@pytest.fixture(scope="module")
def upscalers(tmp_path_factory):
    folder = tmp_path_factory.mktemp("upscalers")
    return {scale: write_random_esrgan(folder / f"esrgan_x{scale}.pth", scale=scale) for scale in (2, 4)}


@pytest.fixture(scope="module")
def frames():
    return np.random.default_rng(0).integers(0, 256, (3, 32, 48, 3), dtype=np.uint8)


# ----- a model file ----------------------------------------------------------------------------------------
def test_a_random_esrgan_file_loads_as_a_2x_esrgan_and_doubles_frames(upscalers, frames):
    upscaler = load_upscaler(upscalers[2])
    assert isinstance(upscaler, Upscaler) and upscaler.scale == 2
    assert upscaler.name == "esrgan_x2.pth (ESRGAN, 2x)"
    out = upscaler.upscale(frames, 2)
    assert out.shape == (3, 64, 96, 3) and out.dtype == np.uint8
    assert out.std() > 5   # a picture, not a flat clamp: what the tiling test below compares is worth comparing


def test_tiles_give_the_whole_frame_s_result_and_tiles_without_context_would_not(upscalers, frames, monkeypatch):
    whole = load_upscaler(upscalers[2], tile=None).upscale(frames, 2).astype(int)
    tiled = load_upscaler(upscalers[2], tile=MIN_TILE).upscale(frames, 2).astype(int)
    assert np.abs(tiled - whole).max() <= 2
    assert np.array_equal(load_upscaler(upscalers[2], tile=40).upscale(frames, 2), whole)   # 32 px of context
    # The check has teeth: the same tiles with no picture around them show their seams.
    monkeypatch.setattr(upscale_module, "TILE_CONTEXT", 0)
    seams = load_upscaler(upscalers[2], tile=MIN_TILE).upscale(frames, 2).astype(int)
    assert np.abs(seams - whole).max() > 5


def test_a_4x_model_asked_for_2x_is_resized_to_exactly_2x(upscalers, frames):
    upscaler = load_upscaler(upscalers[4], tile=24)
    assert upscaler.scale == 4 and "4x" in upscaler.name
    assert upscaler.upscale(frames, 2).shape == (3, 64, 96, 3)
    assert upscaler.upscale(frames[:1], 4).shape == (1, 128, 192, 3)


def test_a_safetensors_file_loads_alike(tmp_path, frames):
    path = write_random_esrgan(tmp_path / "tiny.safetensors", scale=2, seed=1)
    assert load_upscaler(path).upscale(frames[:1], 2).shape == (1, 64, 96, 3)


def test_tile_spans_cover_each_side_once_in_order_none_larger_than_the_tile():
    for length, tile in ((48, 16), (32, 16), (1280, 512), (720, 512), (100, 99), (513, 512)):
        spans = tile_spans(length, tile)
        assert spans[0][2] == 0 and spans[-1][3] == length
        assert all(spans[i][3] == spans[i + 1][2] for i in range(len(spans) - 1))
        assert all(0 <= r0 <= k0 < k1 <= r1 <= length and r1 - r0 <= tile for r0, r1, k0, k1 in spans)
    assert tile_spans(48, None) == [(0, 48, 0, 48)] and tile_spans(16, 16) == [(0, 16, 0, 16)]


def test_wrong_frames_factors_and_tiles_are_refused(upscalers, frames):
    upscaler = load_upscaler(upscalers[2])
    with pytest.raises(ValueError, match="uint8"):
        upscaler.upscale(frames.astype(np.float32), 2)
    with pytest.raises(ValueError, match="factor"):
        upscaler.upscale(frames, 0)
    with pytest.raises(ValueError, match="tile"):
        load_upscaler(upscalers[2], tile=8)


# ----- files that are not upscalers ------------------------------------------------------------------------
def test_random_bytes_are_refused_with_a_message_that_names_the_file(tmp_path):
    path = tmp_path / "upscalers" / "junk.pth"
    path.parent.mkdir()
    path.write_bytes(np.random.default_rng(0).bytes(4096))
    with pytest.raises(ModelError, match=r"upscalers/junk\.pth is not an upscaler model spandrel can read: ") as e:
        load_upscaler(path)
    assert isinstance(e.value, ValueError)


def test_a_state_dict_of_nonsense_keys_is_refused_with_a_message_that_names_the_file(tmp_path):
    path = tmp_path / "upscalers" / "nonsense.pth"
    path.parent.mkdir()
    torch.save({"encoder.weight": torch.zeros(3, 3), "banana": torch.ones(2)}, path)
    with pytest.raises(ValueError, match=r"upscalers/nonsense\.pth is not an upscaler model spandrel can read: "
                                         r"no architecture spandrel knows"):
        load_upscaler(path)


# ----- Lanczos ---------------------------------------------------------------------------------------------
def test_lanczos_doubles_and_quadruples_and_keeps_a_flat_colour(frames):
    assert lanczos(frames, 2).shape == (3, 64, 96, 3) and lanczos(frames[:1], 4).shape == (1, 128, 192, 3)
    flat = np.empty((2, 20, 30, 3), np.uint8)
    flat[:] = (200, 30, 120)
    out = lanczos(flat, 4)
    assert out.dtype == np.uint8 and (out == np.array([200, 30, 120], np.uint8)).all()


# ----- finding the file ------------------------------------------------------------------------------------
def test_find_upscaler_takes_the_first_upscaler_file_by_name(tmp_path):
    assert find_upscaler(tmp_path / "missing") is None
    assert find_upscaler(tmp_path) is None
    for name in ("b_x4.pth", "notes.txt", ".hidden.pth", "c.ckpt"):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "a_folder.pth").mkdir()
    assert find_upscaler(tmp_path) == tmp_path / "b_x4.pth"
    (tmp_path / "A_x2.SAFETENSORS").write_bytes(b"")
    assert find_upscaler(tmp_path) == tmp_path / "A_x2.SAFETENSORS"


# ----- spandrel without torchvision ------------------------------------------------------------------------
@pytest.mark.skipif(_torchvision_imports(), reason="torchvision imports here; the placeholders are not used")
def test_without_torchvision_spandrel_loads_through_placeholders_that_raise_when_called(upscalers):
    assert load_upscaler(upscalers[2]).scale == 2
    lama = importlib.import_module("spandrel.architectures.LaMa.__arch.LaMa")
    restoreformer = importlib.import_module("spandrel.architectures.RestoreFormer")
    for placeholder in (lama.rotate, restoreformer.tv_normalize):
        with pytest.raises(RuntimeError, match="this architecture needs torchvision; upscalers do not"):
            placeholder(torch.zeros(1, 3, 4, 4))
    assert lama.InterpolationMode.BILINEAR.value == "bilinear"
    assert not any(name == "torchvision" or name.startswith("torchvision.") for name in sys.modules)
    with pytest.raises(ImportError):   # the placeholders were there for spandrel's import only
        import torchvision  # noqa: F401


def test_the_placeholders_hold_exactly_what_spandrel_imports_and_every_function_raises():
    modules = torchvision_placeholders()
    assert list(modules) == ["torchvision", "torchvision.transforms", "torchvision.transforms.functional"]
    functional = modules["torchvision.transforms.functional"]
    assert modules["torchvision"].transforms.functional is functional
    assert all(module.__spec__.name == name for name, module in modules.items())   # find_spec() works on them
    for name in ("rotate", "normalize"):
        with pytest.raises(RuntimeError, match="upscalers do not"):
            getattr(functional, name)()


def test_the_placeholders_are_put_in_only_while_spandrel_is_imported_and_never_over_a_working_torchvision(
        monkeypatch):
    monkeypatch.delitem(sys.modules, "spandrel", raising=False)   # as if spandrel were not imported yet
    monkeypatch.delitem(sys.modules, "torchvision", raising=False)
    monkeypatch.setattr(upscale_module, "_torchvision_imports", lambda: True)
    with upscale_module._torchvision_for_spandrel():
        assert "torchvision" not in sys.modules
    monkeypatch.setattr(upscale_module, "_torchvision_imports", lambda: False)
    with upscale_module._torchvision_for_spandrel():
        assert sys.modules["torchvision.transforms.functional"].rotate.__name__ == "rotate"
    assert "torchvision" not in sys.modules and "torchvision.transforms.functional" not in sys.modules
