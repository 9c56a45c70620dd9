"""Once per machine: how fast this device does the few kinds of work a video costs.

The time a run takes is, phase by phase, an amount of work (FLOPs of matrix products, of attention and of
3-D convolutions; bytes copied; frames encoded) divided by how fast this machine does that kind of work.
The amounts come from the model's shapes (engine/planning/timing.py, a pure function); the rates come from
here: a few seconds of small benchmarks, each at a shape like the one the model really runs, timed with the
device synchronised and after a warm-up. The export's rates (frames to uint8, H.264) are measured where the
export lives (engine/outputs/export_rates.py) and handed to ``calibrate`` by its caller. The result is saved
beside the models and reused until the device or torch changes, since either changes the rates; the command
line that measures and saves it is engine/service/calibrate.py.

torch is imported inside the functions only (tests/test_architecture.py): the page starts without it.
"""
from __future__ import annotations

import json
import platform
import statistics
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Callable

from engine.device.hardware import DECIMAL_GB, HardwareProfile

CALIBRATION_FILE = ".calibration.json"
SCHEMA = 2   # 2: small_op_seconds

# Shapes measured. Matrix products: tokens x inner dimension @ inner x 4*inner, the inner dimensions of the
# 1.3B and the 14B transformers (their FFN and projections are of this kind). Attention: 16 heads of 128 at
# several sequence lengths (a Wan video is 8k-75k tokens; efficiency still grows with length below ~16k).
_MATMUL = {"gpu": dict(tokens=16384, dims=(1536, 5120)), "gpu_quick": dict(tokens=8192, dims=(1536, 5120)),
           "cpu": dict(tokens=1024, dims=(512, 1024)), "cpu_quick": dict(tokens=256, dims=(256, 512))}
_ATTENTION = {"gpu": (1024, 4096, 16384, 32768), "gpu_quick": (2048, 8192), "cpu": (512, 2048),
              "cpu_quick": (256, 1024)}
_ATTENTION_HEADS = {"gpu": 16, "cpu": 2}
HEAD_DIM = 128
# 3-D convolutions: the Wan VAE decoders' 3x3x3 layers at their widths, one latent frame's worth (4 output
# frames plus the 2 causal-cache frames). Wan2.1's decoder runs 96 channels at the output size, 192 at half
# of it and 384 at a quarter (a 832x480 video: 96 @ 480x832, 192 @ 240x416, 384 @ 120x208); Wan2.2-5B's runs
# 256 to 1024 channels on smaller areas. Measured at a quarter of those areas, plus a wide layer on a small
# one: (channels, height, width).
_CONV = {"gpu": ((96, 240, 416), (192, 120, 208), (384, 60, 104), (768, 30, 52)),
         "gpu_quick": ((96, 120, 208), (384, 30, 52)),
         "cpu": ((96, 32, 48), (192, 16, 24), (384, 8, 12)),
         "cpu_quick": ((96, 16, 24), (192, 8, 12))}
# The decoder's up-sampling convolutions are 2-D (3x3 over each frame, halving the channels in Wan2.1's), and
# cuDNN's default choice for some is far from its best (a Wan2.1 float32 decode on an H200: 2.80 s with the
# defaults, 2.16 s with cudnn.benchmark, while its 3-D layers gain nothing): (c_in, c_out, height, width).
_CONV2D = {"gpu": ((384, 192, 120, 208), (192, 96, 240, 416), (768, 768, 60, 104)),
           "gpu_quick": ((384, 192, 60, 104), (192, 96, 120, 208)),
           "cpu": ((384, 192, 16, 24), (192, 96, 32, 48)),
           "cpu_quick": ((192, 96, 16, 24),)}
_CONV_FRAMES = 4          # output frames of one conv call (one latent frame of the decoder)
_COPY_BYTES = {"gpu": 1 << 30, "gpu_quick": 256 << 20, "cpu": 256 << 20, "cpu_quick": 64 << 20}


@dataclass(frozen=True)
class Calibration:
    """Rates measured on one machine; the time model (engine/planning/timing.py) divides work by them.

    Throughputs are in TFLOP/s (10^12 FLOP per second, a multiply-add counted as 2), rates in GB/s
    (10^9 bytes per second). A rate that could not be measured here (no device: no copies) is None.
    """
    device_name: str
    backend: str                                     # cuda, rocm, mps or cpu (as HardwareProfile says)
    torch_version: str
    dtype: str                                       # the compute dtype the device figures are for
    matmul_tflops: tuple[tuple[int, float], ...]     # (inner dimension, TFLOP/s): dense matmul in dtype
    attention_tflops: tuple[tuple[int, float], ...]  # (sequence length, TFLOP/s): SDPA, 128-dim heads, in dtype
    conv3d_tflops: tuple[tuple[str, str, int, float], ...]  # (set-up, dtype, channels, TFLOP/s): 3x3x3 conv3d
    memory_gbps: float                               # device memory: bytes read + written per second
    cpu_matmul_tflops: float                         # matmul on the CPU in dtype (an encoder run on the CPU)
    to_uint8_gbps: float                             # host: float32 frames -> uint8 frames, float bytes per s
    h2d_pageable_gbps: float | None = None           # host -> device from ordinary RAM
    h2d_pinned_gbps: float | None = None             # host -> device from page-locked RAM
    d2h_gbps: float | None = None                    # device -> ordinary RAM
    pin_gbps: float | None = None                    # page-locking RAM (tensor.pin_memory()), bytes per s
    encode_megapixels_per_s: float | None = None     # H.264 (libx264, the app's options), per frame pixel
    encode_fixed_s: float | None = None              # ffmpeg's start and the written file's check
    disk_gbps: float | None = None                   # weights read by the last real load; None: not yet known
    conv2d_tflops: tuple[tuple[str, str, int, float], ...] = ()   # (set-up, dtype, width, TFLOP/s): 3x3 conv2d
    attention_seconds: dict = field(default_factory=dict)   # diffusers backend -> s for one self-attention call
    fp8_matmul_tflops: tuple[tuple[int, float], ...] = ()   # (inner dimension, TFLOP/s): float8 matmul; () not run
    # One small operation (a layer on a few channels, a norm, a join): what a model too small for its work to
    # count costs a call (the self-test models: engine/planning/small_work.py).
    small_op_seconds: float | None = None
    quick: bool = False
    seconds: float = 0.0                             # how long the calibration took
    schema: int = SCHEMA

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Calibration":
        """The inverse of ``to_dict`` (JSON lists back to tuples); ValueError when a field is missing or
        malformed. Unknown keys are ignored, so a file from a newer app still reads."""
        if not isinstance(data, dict):
            raise ValueError("a calibration is a JSON object")
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        try:
            values["matmul_tflops"] = tuple((int(k), float(v)) for k, v in values["matmul_tflops"])
            values["attention_tflops"] = tuple((int(k), float(v)) for k, v in values["attention_tflops"])
            values["fp8_matmul_tflops"] = tuple((int(k), float(v)) for k, v in values.get("fp8_matmul_tflops", ()))
            values["conv3d_tflops"] = tuple((str(m), str(d), int(c), float(v)) for m, d, c, v in values["conv3d_tflops"])
            values["conv2d_tflops"] = tuple((str(m), str(d), int(c), float(v))
                                            for m, d, c, v in values.get("conv2d_tflops", ()))
            return cls(**values)
        except (KeyError, TypeError) as exc:
            raise ValueError(f"malformed calibration: {exc}") from exc

    def matches(self, hardware: HardwareProfile) -> bool:
        """Made on this device with this torch: another card, driver build or torch changes the rates."""
        return (self.device_name, self.backend, self.torch_version) == \
            (hardware.device_name, hardware.backend, hardware.torch_version)

    def with_disk_rate(self, gbps: float) -> "Calibration":
        """The same rates, with the disk's rate measured by a real load (the engine reads its weights)."""
        return replace(self, disk_gbps=float(gbps))

    def save(self, folder: Path) -> Path:
        from engine.atomic import write_atomically

        path = Path(folder) / CALIBRATION_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(self.to_dict(), indent=2)
        return write_atomically(path, lambda temporary: temporary.write_text(text, encoding="utf-8"))

    @classmethod
    def load(cls, folder: Path, hardware: HardwareProfile) -> "Calibration | None":
        """The calibration saved in ``folder`` if it was made on ``hardware`` with its torch; None when
        there is none, it cannot be read, or it was made elsewhere (its rates would mislead)."""
        try:
            data = json.loads((Path(folder) / CALIBRATION_FILE).read_text(encoding="utf-8"))
            calibration = cls.from_dict(data)
        except (OSError, ValueError):
            return None
        if calibration.schema != SCHEMA or not calibration.matches(hardware):
            return None
        return calibration


# ----- measuring ------------------------------------------------------------------------------------------

def _dtype(torch, dtype):
    return getattr(torch, dtype) if isinstance(dtype, str) else dtype


def _dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def timer(device: str) -> Callable[[Callable[[], object], int, int], float]:
    """seconds(fn, repeats, inner): the median over ``repeats`` samples of ``inner`` calls of ``fn`` (per
    call), after one warm-up sample, with the device synchronised before and after each sample."""
    from engine.device.runtime import synchronize

    def seconds(fn, repeats: int = 3, inner: int = 1) -> float:
        fn()
        synchronize(device)
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            for _ in range(inner):
                fn()
            synchronize(device)
            samples.append((time.perf_counter() - start) / inner)
        return statistics.median(samples)
    return seconds


def _machine(device: str) -> tuple[str, str]:
    """(device name, backend) as hardware detection words them, so a saved calibration is found again."""
    import torch

    if device.startswith("cuda"):
        backend = "rocm" if getattr(torch.version, "hip", None) else "cuda"
        return torch.cuda.get_device_properties(torch.device(device)).name, backend
    if device.startswith("mps"):
        return platform.processor() or "Apple GPU", "mps"
    return platform.processor() or platform.machine(), "cpu"


def _matmul(torch, device, dtype, seconds, tokens: int, dims) -> tuple[tuple[int, float], ...]:
    points = []
    for dim in dims:
        a = torch.randn(tokens, dim, device=device, dtype=dtype)
        b = torch.randn(dim, 4 * dim, device=device, dtype=dtype)
        t = seconds(lambda: a @ b, 3, 5 if device != "cpu" else 1)
        points.append((dim, round(2 * tokens * dim * 4 * dim / t / 1e12, 3)))
    return tuple(points)


def fp8_matmul(torch, device, seconds, tokens: int, dims) -> tuple[tuple[int, float], ...]:
    """float8 (e4m3) matrix products as torchao's float8 linears run them (torch._scaled_mm, one scale a tensor,
    bfloat16 out) at the matmul shapes: (inner dimension, TFLOP/s); () where this device has no float8 kernel."""
    points = []
    scale = torch.ones((), device=device)
    try:
        for dim in dims:
            a = torch.randn(tokens, dim, device=device).to(torch.float8_e4m3fn)
            b = torch.randn(4 * dim, dim, device=device).to(torch.float8_e4m3fn).t()   # column-major, as it wants
            t = seconds(lambda: torch._scaled_mm(a, b, scale_a=scale, scale_b=scale, out_dtype=torch.bfloat16),
                        3, 5 if device != "cpu" else 1)
            points.append((dim, float(f"{2 * tokens * dim * 4 * dim / t / 1e12:.4g}")))
    except (RuntimeError, AttributeError, TypeError, NotImplementedError):   # no float8 type or kernel here
        return ()
    return tuple(points)


def _attention(torch, device, dtype, seconds, lengths, heads) -> tuple[tuple[int, float], ...]:
    import torch.nn.functional as F

    points = []
    for length in lengths:
        q, k, v = (torch.randn(1, heads, length, HEAD_DIM, device=device, dtype=dtype) for _ in range(3))
        t = seconds(lambda: F.scaled_dot_product_attention(q, k, v), 3, 3 if device != "cpu" else 1)
        points.append((length, round(4 * length * length * heads * HEAD_DIM / t / 1e12, 3)))
    return tuple(points)


def _convs(torch, device, dtypes, seconds, shapes, shapes_2d, modes) -> tuple[tuple, tuple]:
    """(conv3d points, conv2d points): the decoder's convolutions in each set-up it may run under
    (engine/planning/speed.py CONV_MODES), the defaults first (cuDNN remembers what benchmark chose).
    A 3-D one is causal as the Wan VAE runs it: 2 cached frames in front, no temporal padding."""
    import torch.nn.functional as F

    cudnn = torch.backends.cudnn
    saved = (cudnn.benchmark, cudnn.enabled)
    points_3d, points_2d = [], []
    try:
        for mode in modes:
            cudnn.benchmark, cudnn.enabled = mode == "benchmark", mode != "no_miopen"
            for dtype in dtypes:
                for channels, height, width in shapes:
                    x = torch.randn(1, channels, _CONV_FRAMES + 2, height, width, device=device, dtype=dtype)
                    w = torch.randn(channels, channels, 3, 3, 3, device=device, dtype=dtype) * 0.01
                    t = seconds(lambda: F.conv3d(x, w, padding=(0, 1, 1)), 3, 3 if device != "cpu" else 1)
                    flops = 2 * 27 * channels * channels * _CONV_FRAMES * height * width
                    points_3d.append((mode, _dtype_name(dtype), channels, round(flops / t / 1e12, 3)))
                for c_in, c_out, height, width in shapes_2d:
                    x = torch.randn(_CONV_FRAMES, c_in, height, width, device=device, dtype=dtype)
                    w = torch.randn(c_out, c_in, 3, 3, device=device, dtype=dtype) * 0.01
                    t = seconds(lambda: F.conv2d(x, w, padding=1), 3, 3 if device != "cpu" else 1)
                    flops = 2 * 9 * c_in * c_out * _CONV_FRAMES * height * width
                    points_2d.append((mode, _dtype_name(dtype), round((c_in * c_out) ** 0.5),
                                      round(flops / t / 1e12, 3)))
    finally:
        cudnn.benchmark, cudnn.enabled = saved
    return tuple(points_3d), tuple(points_2d)


def _conv_modes(torch, device: str) -> tuple[str, ...]:
    """The convolution set-ups to measure: the defaults, and the one the planner picks for this backend
    (cuDNN benchmark on CUDA, MIOpen off on ROCm: engine/planning/speed.py conv_mode_for)."""
    if device.startswith("cuda"):
        return ("default", "no_miopen" if getattr(torch.version, "hip", None) else "benchmark")
    return ("default",)


def _memory_gbps(torch, device, seconds, nbytes: int) -> float:
    x = torch.empty(nbytes // 4, device=device, dtype=torch.float32).fill_(1.0)
    y = torch.empty_like(x)
    t = seconds(lambda: y.copy_(x), 3, 3 if device != "cpu" else 1)
    return round(2 * nbytes / t / DECIMAL_GB, 2)


SMALL_OP_SAMPLES = 15
SMALL_OP_WARMUP_S = 0.2   # calls first, this long: a fresh process's first calls are slower


def _small_op_probe(torch, device) -> Callable[[], float]:
    """A probe of the seconds of one small operation: the mean of a decoder block's kinds of call (a 3x3x3
    convolution, a norm, an activation, a cached frame joined on, a linear layer, an add) on a few channels, where
    the call and not its arithmetic is the cost. Warmed up once; each call of the probe is the fastest of a few
    samples (a moment's contention is not this machine's pace), and the calibration takes the median of probes spread
    over its run (the pace of a shared machine drifts by tens of percent from second to second)."""
    import torch.nn.functional as F

    from engine.device.runtime import synchronize

    x = torch.randn(1, 4, 3, 16, 16, device=device)
    weight = torch.randn(4, 4, 3, 3, 3, device=device)
    tokens, projection = torch.randn(64, 32, device=device), torch.randn(32, 32, device=device)

    def calls() -> None:
        y = F.conv3d(x, weight, padding=1)
        y = F.silu(F.group_norm(y, 2))
        y = torch.cat([x[:, :, -1:], y], dim=2)
        F.linear(tokens, projection).add_(1.0)

    warm_until = time.perf_counter() + SMALL_OP_WARMUP_S
    while time.perf_counter() < warm_until:
        calls()

    def probe() -> float:
        fastest = float("inf")
        for _ in range(SMALL_OP_SAMPLES):
            start = time.perf_counter()
            for _ in range(10):
                calls()
            synchronize(device)
            fastest = min(fastest, (time.perf_counter() - start) / 10)
        return fastest / 6
    return probe


def _copies(torch, device, seconds, nbytes: int) -> dict:
    """Host <-> device copy rates and the rate of page-locking RAM (what pinning a model costs)."""
    host = torch.ones(nbytes, dtype=torch.uint8)
    pinned_at = time.perf_counter()
    pinned = host.pin_memory()
    pin_seconds = time.perf_counter() - pinned_at
    on_device = torch.empty(nbytes, dtype=torch.uint8, device=device)
    rates = {
        "h2d_pageable_gbps": nbytes / seconds(lambda: on_device.copy_(host)) / DECIMAL_GB,
        "h2d_pinned_gbps": nbytes / seconds(lambda: on_device.copy_(pinned, non_blocking=True)) / DECIMAL_GB,
        "d2h_gbps": nbytes / seconds(lambda: on_device.to("cpu")) / DECIMAL_GB,
        "pin_gbps": nbytes / pin_seconds / DECIMAL_GB,
    }
    return {k: round(v, 2) for k, v in rates.items()}


def calibrate(device: str, dtype, quick: bool = False, *, export_rates: Callable[[bool], dict]) -> Calibration:
    """Measure this machine's rates on ``device`` in the compute ``dtype`` (a torch dtype or its name).

    5-8 s on an H200 (about 1.3 s with ``quick``); ``quick`` on a 2-core CPU about 1-2 s. The CPU's matrix
    rate is measured too, for encoders the plan runs on the CPU; on a GPU (not ``quick``) float8 matrix products
    too, for the float8 linears. On CUDA and ROCm the decoder's convolutions
    are measured in the set-up the planner picks too (cudnn.benchmark, MIOpen off), after the defaults.
    ``export_rates(quick)``: the export's fields (``to_uint8_gbps``, the H.264 rates), measured by the layer that
    exports (engine/outputs/export_rates.py's export_rates), so the device never imports it.
    """
    import torch

    started = time.perf_counter()
    compute = _dtype(torch, dtype)
    on_cpu = device == "cpu"
    size = ("cpu" if on_cpu else "gpu") + ("_quick" if quick else "")
    seconds = timer(device)
    conv_dtypes = [torch.float32] + ([compute] if compute != torch.float32 else [])
    with torch.inference_mode():
        small_op = _small_op_probe(torch, device)
        probes = [small_op()]
        matmul = _matmul(torch, device, compute, seconds, **_MATMUL[size])
        attention = _attention(torch, device, compute, seconds, _ATTENTION[size],
                               _ATTENTION_HEADS["cpu" if on_cpu else "gpu"])
        probes.append(small_op())
        conv, conv_2d = _convs(torch, device, conv_dtypes, seconds, _CONV[size], _CONV2D[size],
                               _conv_modes(torch, device))
        memory = _memory_gbps(torch, device, seconds, _COPY_BYTES[size])
        probes.append(small_op())
        if on_cpu:
            cpu_matmul = max(v for _, v in matmul)
            copies = {}
        else:
            cpu_matmul = max(v for _, v in _matmul(torch, "cpu", compute, timer("cpu"),
                                                    **_MATMUL["cpu_quick" if quick else "cpu"]))
            copies = _copies(torch, device, seconds, _COPY_BYTES[size]) if device.startswith("cuda") else {}
        # float8 linears are offered on CUDA and ROCm GPUs only (engine/planning/speed.py fp8_compute_missing).
        fp8 = fp8_matmul(torch, device, seconds, **_MATMUL[size]) if device.startswith("cuda") and not quick else ()
    export = export_rates(quick)
    name, backend = _machine(device)
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return Calibration(
        device_name=name, backend=backend, torch_version=str(torch.__version__), dtype=_dtype_name(compute),
        matmul_tflops=matmul, attention_tflops=attention, conv3d_tflops=conv, conv2d_tflops=conv_2d,
        memory_gbps=memory, fp8_matmul_tflops=fp8, small_op_seconds=round(statistics.median(probes), 8),
        cpu_matmul_tflops=cpu_matmul, **copies, **export, quick=quick,
        seconds=round(time.perf_counter() - started, 2))
