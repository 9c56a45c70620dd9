"""Upscaling a video's frames 2x or 4x: with an upscaler model a user dropped in ``models/upscalers/`` when there
is one, with Lanczos when there is none.

Why spandrel: upscaler files (ESRGAN, Real-ESRGAN, SwinIR, HAT, DAT, ... as .pth or .safetensors) are bare
state dicts in a dozen layouts; spandrel, the loader ComfyUI and chaiNNer use, recognises the architecture and
its sizes from the keys and gives one calling convention for all of them (float NCHW in [0, 1], out
``scale`` times larger). Whatever file people have collected for those apps works here.

Why tiles: a 4x model's inner layers are 16 times the frame's pixels at 64 channels; a whole 1280 x 720 frame
takes many GB. Each frame is cut into squares of at most ``tile`` pixels that overlap by ``TILE_CONTEXT``; each
square is upscaled alone and only its centre is kept, so a square's edge (where the model sees zero padding
instead of the picture) never shows. Frames go through one at a time, so memory does not grow with the video.

Why a stand-in for torchvision: spandrel lists torchvision as a dependency and imports every architecture when
it is imported; two of them (LaMa, an inpainting model, and RestoreFormer, a face restorer) import names from
``torchvision.transforms.functional`` at import time and call them only when they run. torchvision has to match
torch's build exactly and is often missing or broken; upscalers never use it. So when it cannot be imported,
``_torchvision_for_spandrel`` puts placeholders in its place while spandrel is imported (and only then).
"""
from __future__ import annotations

import contextlib
import enum
import sys
import types
from importlib.machinery import ModuleSpec
from pathlib import Path

import numpy as np
from PIL import Image

from engine.errors import ModelError
from engine.models.safe_weights import read_tensors
from engine.models.weights import WeightFileError

UPSCALER_SUFFIXES = (".pth", ".safetensors", ".pt", ".ckpt")
# Larger scales than this are not upscalers a video wants (and no published one is).
MAX_MODEL_SCALE = 8
# Pixels of picture around each tile's kept centre, on every side that has picture: ComfyUI's overlap. ESRGAN's
# reach fades within a few pixels (each block adds 0.2 of its change), so 32 leaves no visible seam.
TILE_CONTEXT = 32
# The smallest tile: below it the context would be most of the work.
MIN_TILE = 16
# The names spandrel 0.4.2 imports from torchvision.transforms.functional (LaMa: InterpolationMode, rotate;
# RestoreFormer: normalize). All are used only when those models run, none at import (no default argument).
_TORCHVISION_FUNCTIONS = ("rotate", "normalize")


def find_upscaler(folder: Path) -> Path | None:
    """The first upscaler file in ``folder`` by name (case aside), hidden files skipped; None when the folder is
    missing or has none."""
    try:
        files = [p for p in Path(folder).iterdir()
                 if p.suffix.lower() in UPSCALER_SUFFIXES and not p.name.startswith(".") and p.is_file()]
    except OSError:
        return None
    return min(files, key=lambda p: (p.name.lower(), p.name), default=None)


def lanczos(frames: np.ndarray, factor: int) -> np.ndarray:
    """uint8 frames (n, H, W, 3) resized to (n, H*factor, W*factor, 3) with PIL's Lanczos filter."""
    _check_frames(frames)
    _check_factor(factor)
    n, height, width, _ = frames.shape
    out = np.empty((n, height * factor, width * factor, 3), np.uint8)
    for index, frame in enumerate(frames):
        out[index] = _resized(frame, width * factor, height * factor)
    return out


def _resized(frame: np.ndarray, width: int, height: int) -> np.ndarray:
    return np.asarray(Image.fromarray(frame).resize((width, height), Image.Resampling.LANCZOS))


def _check_frames(frames: np.ndarray) -> None:
    if not (isinstance(frames, np.ndarray) and frames.dtype == np.uint8 and frames.ndim == 4
            and frames.shape[3] == 3):
        shape = getattr(frames, "shape", None)
        raise ValueError(f"frames to upscale are uint8 (n, H, W, 3), got {shape} {getattr(frames, 'dtype', '')}")


def _check_factor(factor: int) -> None:
    if isinstance(factor, bool) or not isinstance(factor, (int, np.integer)) or not 1 <= factor <= MAX_MODEL_SCALE:
        raise ValueError(f"the upscale factor is a whole number from 1 to {MAX_MODEL_SCALE} (2 or 4), "
                         f"got {factor!r}")


def tile_spans(length: int, tile: int | None) -> list[tuple[int, int, int, int]]:
    """Along one side of ``length`` pixels: ``(read_start, read_end, keep_start, keep_end)`` for each tile, the
    part the model sees (at most ``tile``) and the part of it kept; the kept parts cover the side once, in order.
    One span, all of it, when ``tile`` is None or the side fits."""
    if tile is None or length <= tile:
        return [(0, length, 0, length)]
    context = min(TILE_CONTEXT, tile // 4)
    core = tile - 2 * context
    spans = []
    for start in range(0, length, core):
        end = min(start + core, length)
        spans.append((max(0, start - context), min(length, end + context), start, end))
    return spans


class Upscaler:
    """An upscaler model ready to run (a spandrel image model descriptor on its device, in its dtype).

    ``name`` says the file, architecture and scale ("RealESRGAN_x4plus.pth (ESRGAN, 4x)"); ``scale`` is the
    model's own; ``tile`` the largest square it sees at once (None: whole frames).
    """

    def __init__(self, model, name: str, tile: int | None = 512):
        self.model, self.name, self.scale, self.tile = model, name, int(model.scale), tile

    def __repr__(self) -> str:
        return f"Upscaler({self.name}, tile={self.tile})"

    def upscale(self, frames: np.ndarray, factor: int) -> np.ndarray:
        """uint8 frames (n, H, W, 3) to uint8 (n, H*factor, W*factor, 3): through the model frame by frame, then
        resized with Lanczos to exactly ``factor`` times when the model's scale is another (a 4x model asked
        for 2x)."""
        _check_frames(frames)
        _check_factor(factor)
        n, height, width, _ = frames.shape
        out = np.empty((n, height * factor, width * factor, 3), np.uint8)
        for index, frame in enumerate(frames):
            up = self._run(frame)
            out[index] = up if self.scale == factor else _resized(up, width * factor, height * factor)
        return out

    def _run(self, frame: np.ndarray) -> np.ndarray:
        """One uint8 frame (H, W, 3) through the model, tile by tile: uint8 (H*scale, W*scale, 3)."""
        import torch

        height, width, _ = frame.shape
        s = self.scale
        whole = self.tile is None or self.model.tiling.name == "INTERNAL"   # the model tiles on its own
        tile = None if whole else self.tile
        out = np.empty((height * s, width * s, 3), np.uint8)
        with torch.inference_mode():
            image = torch.from_numpy(np.ascontiguousarray(frame)).to(self.model.device)
            image = image.permute(2, 0, 1).unsqueeze(0).to(self.model.dtype).div_(255)
            for y0, y1, keep_y0, keep_y1 in tile_spans(height, tile):
                for x0, x1, keep_x0, keep_x1 in tile_spans(width, tile):
                    result = self.model(image[:, :, y0:y1, x0:x1])   # clamped to [0, 1] by spandrel
                    kept = result[0, :, (keep_y0 - y0) * s:(keep_y1 - y0) * s, (keep_x0 - x0) * s:(keep_x1 - x0) * s]
                    levels = kept.float().mul_(255).round_().to(torch.uint8).permute(1, 2, 0).cpu().numpy()
                    out[keep_y0 * s:keep_y1 * s, keep_x0 * s:keep_x1 * s] = levels
                    del result, kept
        return out


def load_upscaler(path: Path, device: str = "cpu", tile: int | None = 512, half: bool = False) -> Upscaler:
    """The upscaler model in ``path`` on ``device`` (float16 when ``half`` on a GPU and the architecture allows
    it, else float32); ModelError (a ValueError) naming the file when spandrel cannot read it or it is not an
    RGB image-to-image model of scale 1 to 8."""
    import torch

    path = Path(path)
    if tile is not None and tile < MIN_TILE:
        raise ValueError(f"an upscaler tile is at least {MIN_TILE} pixels (or None: whole frames), got {tile}")
    try:   # read as data here: spandrel's own reader runs a TorchScript file's code (engine/models/safe_weights.py)
        state = read_tensors(path)
    except WeightFileError as error:
        raise _unreadable(path, str(error)) from None
    spandrel = _import_spandrel()
    out_of_memory = (MemoryError, getattr(torch, "OutOfMemoryError", MemoryError))
    try:
        model = spandrel.ModelLoader(device).load_from_state_dict(spandrel.canonicalize_state_dict(state))
    except out_of_memory:
        raise
    except Exception as error:
        raise _unreadable(path, _first_line(error) or "no architecture spandrel knows has these weights") from error
    problem = _not_an_upscaler(model, spandrel)
    if problem:
        raise _unreadable(path, problem)
    if half and model.supports_half and torch.device(device).type != "cpu":
        model.half()
    model.eval()
    return Upscaler(model, f"{path.name} ({model.architecture.name}, {model.scale}x)", tile)


def _unreadable(path: Path, reason: str) -> ModelError:
    return ModelError(f"{path.parent.name}/{path.name} is not an upscaler model spandrel can read: {reason}")


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0][:200] if text else ""


def _not_an_upscaler(model, spandrel) -> str | None:
    """Why a model spandrel read cannot upscale video frames, or None when it can."""
    kind = model.architecture.name
    if not isinstance(model, spandrel.ImageModelDescriptor):
        return f"it is a {kind} {model.purpose.lower()} model, which needs a mask besides the image"
    if model.purpose == "FaceSR":
        return f"it is a {kind} face restoration model, which works on cropped faces, not whole frames"
    if not 1 <= model.scale <= MAX_MODEL_SCALE:
        return f"its scale is {model.scale}x, and upscalers here are 1x to {MAX_MODEL_SCALE}x"
    if model.input_channels != 3 or model.output_channels != 3:
        return (f"it turns {model.input_channels}-channel images into {model.output_channels}-channel ones, "
                f"and video frames are RGB")
    return None


def _import_spandrel():
    """The spandrel module, imported (with placeholders for torchvision the first time, when the real one cannot
    be imported)."""
    with _torchvision_for_spandrel():
        import spandrel
    return spandrel


@contextlib.contextmanager
def _torchvision_for_spandrel():
    """While inside, ``torchvision``, ``torchvision.transforms`` and ``torchvision.transforms.functional`` are
    placeholders in ``sys.modules`` when spandrel is not imported yet and the real torchvision cannot be imported;
    nothing changes otherwise.

    This is the module's one change to interpreter-wide state, and it lasts only for spandrel's import: the
    modules that import from torchvision keep their own references to the placeholders' names, and afterwards
    ``sys.modules`` is as it was, so other code (transformers' and diffusers' checks for torchvision) still
    finds no torchvision.
    """
    if "spandrel" in sys.modules or _torchvision_imports():
        yield
        return
    placeholders = torchvision_placeholders()
    before = {name: sys.modules.get(name) for name in placeholders}
    sys.modules.update(placeholders)
    try:
        yield
    finally:
        for name, module in before.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def _torchvision_imports() -> bool:
    """Whether the real torchvision imports (a build that does not match torch's raises more than ImportError)."""
    try:
        import torchvision  # noqa: F401
    except Exception:
        return False
    return True


def torchvision_placeholders() -> dict[str, types.ModuleType]:
    """Modules named ``torchvision``, ``torchvision.transforms`` and ``torchvision.transforms.functional``, the
    last with the names spandrel imports from it: ``InterpolationMode`` (an enum with torchvision's values, as
    harmless as its original) and functions that raise RuntimeError when called."""

    def needs_torchvision(name: str):
        def placeholder(*args, **kwargs):
            raise RuntimeError(f"torchvision.transforms.functional.{name} was called, but torchvision cannot be "
                               f"imported here: this architecture needs torchvision; upscalers do not")
        placeholder.__name__ = placeholder.__qualname__ = name
        return placeholder

    modules = {}
    for name in ("torchvision", "torchvision.transforms", "torchvision.transforms.functional"):
        module = types.ModuleType(name, "A placeholder (engine/post/upscale.py): torchvision cannot be imported.")
        package = not name.endswith(".functional")
        module.__spec__ = ModuleSpec(name, None, is_package=package)
        if package:
            module.__path__ = []
        modules[name] = module
    functional = modules["torchvision.transforms.functional"]
    functional.InterpolationMode = enum.Enum("InterpolationMode", {
        "NEAREST": "nearest", "NEAREST_EXACT": "nearest-exact", "BILINEAR": "bilinear", "BICUBIC": "bicubic",
        "BOX": "box", "HAMMING": "hamming", "LANCZOS": "lanczos"})
    for name in _TORCHVISION_FUNCTIONS:
        setattr(functional, name, needs_torchvision(name))
    modules["torchvision"].transforms = modules["torchvision.transforms"]
    modules["torchvision.transforms"].functional = functional
    return modules


def write_random_esrgan(path: Path, scale: int = 2, seed: int = 0, features: int = 8, blocks: int = 1) -> Path:
    """For tests: a random-weight ESRGAN (spandrel's RRDBNet, the old-ESRGAN key names ``model.0.weight``,
    ``model.1.sub.0.RDB1.conv1.0.weight``, ...) with ``features`` channels and ``blocks`` blocks, saved as a
    plain dict of tensors (torch.save; safetensors for a .safetensors name). Its last bias is raised by 0.5 so
    its outputs vary around mid-grey instead of being clamped to black. The global random state is untouched."""
    import torch

    if scale not in (1, 2, 3, 4, 8):
        raise ValueError(f"an ESRGAN's scale is 1, 2, 3, 4 or 8, got {scale}")
    _import_spandrel()
    from spandrel.architectures.ESRGAN import ESRGAN

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = ESRGAN(num_filters=features, num_blocks=blocks, scale=scale)
    state = {key: value.detach().clone().contiguous() for key, value in model.state_dict().items()}
    state[list(state)[-1]] += 0.5   # the last layer's bias (its weight comes before it)
    path = Path(path)
    if path.suffix.lower() == ".safetensors":
        from safetensors.torch import save_file
        save_file(state, str(path))
    else:
        torch.save(state, path)
    return path
