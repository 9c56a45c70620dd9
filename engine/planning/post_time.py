"""How long the steps after the video is written take (engine/post/: smoother, larger), said before they run.

Each step runs one of four methods, and which depends on the users' files (engine/post/apply.py): smoother with RIFE
when there is a file in ``models/interpolators/``, else ffmpeg's minterpolate; larger with the upscaler model in
``models/upscalers/``, else Lanczos. The planner reads no files: the caller says what is there (``PostFiles``,
engine/run/time_plan.py post_files). A step's seconds are its fixed cost plus its work over the method's rate, the work
in megapixels of the frames that cost it:

- RIFE on a GPU: the frames written (the network is quick there; reading, converting and encoding the frames set
  the pace), at an H200's rate (docs/data/post-h200.json: the same rate held at 832x480 and 1280x720);
- RIFE on a CPU: the frames it makes, padded as RIFE pads them, at a rate that follows the CPU's measured matrix
  rate (the calibration's ``cpu_matmul_tflops``), measured here on a 2-core CPU (docs/data/post-cpu.json);
- an upscaler model: the frames it reads, weighed by its file's size against RealESRGAN_x4plus's (most of its work
  grows with its weights), on a GPU at an H200's rate scaled by the device's measured matrix rate against the H200's,
  on a CPU as RIFE's on a CPU; never quicker than Lanczos writing the same frames;
- minterpolate and Lanczos (the CPU, whatever runs the model): the frames written, at the rates measured here
  (docs/data/post-cpu.json; the H200 machine's 16 cores measured 3.5 and 33.5 megapixels a second for them, a single
  core's work for either, so more cores hardly help).

The fixed costs (starting ffmpeg twice, reading a model file) are those fitted beside the rates. A run's measured
seconds correct these (engine/planning/learning.py learn_post), matched by ``PostWork.method``.
"""
from __future__ import annotations

from dataclasses import dataclass

from engine.device.calibrate import Calibration
from engine.planning.export_time import DEFAULT_ENCODE_FIXED_S, process_start_seconds

# The phases of the steps, in the order they run (interpolation first: it works on the smaller frames).
POST_PHASES = ("interpolate", "upscale")
# RIFE pads each frame to a multiple of this a side before it runs (engine/post/rife.py PAD_MULTIPLE).
RIFE_PAD = 64

# ----- on a GPU: an H200 (docs/data/post-h200.json, bench/post_gpu.py, docs/speed.md "Smoother and larger") ------
# RIFE 4.7 in float16: 161 frames of 832x480 (64.3 MP) written in 1.673 s; 33 frames of 1280x720 (30.4 MP) in 0.78 s,
# which this rate puts at 0.79 s. No fixed cost was left over between the two.
RIFE_GPU_MPS = 38.4
# An ESRGAN of RealESRGAN_x4plus's size (67 MB) in float16, 512-pixel tiles: 81 frames of 832x480 (32.3 MP read) in
# 29.94 s, on a device whose calibrated matrix rate is H200_MATMUL_TFLOPS (docs/data/timing-h200.json).
UPSCALER_GPU_MPS = 1.08
H200_MATMUL_TFLOPS = 802.0
# The upscaler file the work is counted against: RealESRGAN_x4plus.pth, about 67 MB in float32.
REFERENCE_UPSCALER_BYTES = 67_000_000

# ----- on a CPU: measured here by bench/post_cpu.py (docs/data/post-cpu.json), 2 cores, torch's float32 ------------
# The CPU's calibrated matrix rate there (the median of three quick calibrations, as the engine runs it on a CPU).
BENCH_CPU_TFLOPS = 0.194
# (megapixels a second, fixed seconds) of each method, fitted over two lengths, two sizes and both factors.
RIFE_CPU = (1.40, 0.11)            # the frames RIFE makes, padded
MINTERPOLATE = (6.7, 0.0)          # the frames written (the H200 machine: 3.5), beside its processes' start:
# minterpolate's ffmpeg processes (the video read, filtered, written) and their files cost this many times the
# export's calibrated fixed cost (a one-frame thumbnail's write): a 64x64 clip's 17 frames took 0.11-0.19 s on the
# 2-core CPU against 0.035-0.045 s of it (docs/data/small-work-cpu.json); its larger runs are 0.67-1.38 of this rate's
# figure (docs/data/post-cpu.json).
MINTERPOLATE_PROCESSES = 3
LANCZOS = (35.3, 0.17)             # the frames written (the H200 machine: 33.5)
# An upscaler's work a megapixel read is (its file's size against the reference's + UPSCALER_BASE), counted so the
# reference file's is 1: a 3.5 MB ESRGAN (32 features, 2 blocks) took 23 s a megapixel read where the 67 MB one took
# 124 s, not 19 times less: the upsampling layers work at the larger sizes whatever the file.
UPSCALER_BASE = 0.165
UPSCALER_CPU_MPS = 0.00803         # the reference file's megapixels read a second
# Reading the file and building the model, on the CPU: 1.86 s for the 67 MB file, 0.02 s for the 3.5 MB one.
UPSCALER_LOAD_S = 1.85


@dataclass(frozen=True)
class PostFiles:
    """The users' files the steps will find: a RIFE file in models/interpolators/ or not, and the size of the upscaler
    file in models/upscalers/ (0: none, so Lanczos). Looked for where the folders are (engine/run/time_plan.py)."""
    interpolator: bool = False
    upscaler_bytes: int = 0


@dataclass(frozen=True)
class PostWork:
    """One step as the time model counts it: its phase, how it runs (``method``: "rife/gpu", "rife/cpu",
    "minterpolate", "upscaler/gpu/<file bytes>", "upscaler/cpu/<file bytes>", "lanczos"; a run is learned from only by
    the same method), its work in megapixels of the method's own kind, and the megapixels of the frames it writes."""
    phase: str
    method: str
    megapixels: float
    written: float

    def to_dict(self) -> dict:
        return {"method": self.method, "megapixels": round(self.megapixels, 4), "written": round(self.written, 4)}


def post_works(width: int, height: int, frames: int, interpolate: int, upscale: int, device: str,
               files: PostFiles) -> tuple[PostWork, ...]:
    """The steps asked for (a factor of 1 is none), in the order they run, on a video of ``frames`` frames of
    ``width`` x ``height``, their model (if any) run on ``device``: the upscaler sees the frames the smoother made."""
    where = "cpu" if device == "cpu" else "gpu"
    works = []
    if interpolate > 1:
        made = (frames - 1) * interpolate + 1      # as engine/post/steps.py PostStep.shape_after counts them
        written = made * width * height / 1e6
        if files.interpolator:
            padded = _padded(width) * _padded(height) / 1e6
            works.append(PostWork("interpolate", f"rife/{where}",
                                  written if where == "gpu" else (made - frames) * padded, written))
        else:
            works.append(PostWork("interpolate", "minterpolate", written, written))
        frames = made
    if upscale > 1:
        written = frames * width * height * upscale ** 2 / 1e6
        if files.upscaler_bytes:
            read = frames * width * height / 1e6
            weight = (files.upscaler_bytes / REFERENCE_UPSCALER_BYTES + UPSCALER_BASE) / (1 + UPSCALER_BASE)
            works.append(PostWork("upscale", f"upscaler/{where}/{files.upscaler_bytes}", read * weight, written))
        else:
            works.append(PostWork("upscale", "lanczos", written, written))
    return tuple(works)


def _padded(side: int) -> int:
    return -(-side // RIFE_PAD) * RIFE_PAD


def post_seconds(work: PostWork, calibration: Calibration) -> tuple[float, str]:
    """(seconds, how) of one step on the calibrated machine."""
    rate, fixed, source = method_rate(work.method, calibration)
    seconds = fixed + work.megapixels / rate
    how = f"{_what(work)}: {work.megapixels:.1f} MP {_unit(work.method)} at {rate:.3g} MP/s ({source})"
    if work.method.startswith("upscaler/"):
        floor = LANCZOS[1] + work.written / LANCZOS[0]
        if floor > seconds:
            seconds = floor
            how += f"; no quicker than writing its {work.written:.0f} MP of frames, {floor:.1f} s"
    return seconds, how + (f" + {fixed:.2f} s" if fixed else "")


def method_rate(method: str, calibration: Calibration) -> tuple[float, float, str]:
    """(megapixels a second, fixed seconds, where the rate comes from) of ``method`` (a PostWork's)."""
    kind, _, where = method.partition("/")
    cpu = calibration.cpu_matmul_tflops / BENCH_CPU_TFLOPS
    cpu_source = (f"{BENCH_CPU_TFLOPS} TFLOP/s CPU's rate x {cpu:.2f}, this CPU's matrix rate against it; "
                  "docs/data/post-cpu.json")
    if kind == "rife" and where == "gpu":
        return RIFE_GPU_MPS, 0.0, "an H200's, docs/data/post-h200.json"
    if kind == "rife":
        return RIFE_CPU[0] * cpu, RIFE_CPU[1], cpu_source
    if kind == "upscaler" and where.startswith("gpu"):
        device = max(rate for _, rate in calibration.matmul_tflops) / H200_MATMUL_TFLOPS
        return (UPSCALER_GPU_MPS * device, 0.0,
                f"an H200's x {device:.2g}, this device's matrix rate against it; docs/data/post-h200.json")
    if kind == "upscaler":
        return UPSCALER_CPU_MPS * cpu, method_fixed(method), cpu_source
    if kind == "minterpolate":
        return (MINTERPOLATE[0], MINTERPOLATE_PROCESSES * process_start_seconds(calibration),
                "a CPU core's, docs/data/post-cpu.json")
    return LANCZOS[0], LANCZOS[1], "a CPU core's, docs/data/post-cpu.json"


def method_fixed(method: str) -> float:
    """The fixed seconds of ``method``, which do not grow with its work."""
    kind, _, where = method.partition("/")
    if kind == "rife":
        return 0.0 if where == "gpu" else RIFE_CPU[1]
    if kind == "upscaler":
        device, _, size = where.partition("/")
        return 0.0 if device == "gpu" else UPSCALER_LOAD_S * int(size or 0) / REFERENCE_UPSCALER_BYTES
    return MINTERPOLATE_PROCESSES * DEFAULT_ENCODE_FIXED_S if kind == "minterpolate" else LANCZOS[1]


def _what(work: PostWork) -> str:
    kind, _, where = work.method.partition("/")
    on = "the GPU" if where.startswith("gpu") else "the CPU"
    if kind == "rife":
        return f"RIFE on {on}"
    if kind == "upscaler":
        size = int(where.partition("/")[2] or 0)
        return f"the upscaler file ({size / 1e6:.0f} MB) on {on}"
    return "ffmpeg's minterpolate on the CPU (no RIFE file)" if kind == "minterpolate" else \
        "Lanczos on the CPU (no upscaler file)"


def _unit(method: str) -> str:
    if method == "rife/cpu":
        return "of frames made"
    if method.startswith("upscaler/"):
        return "of frames read, weighed by the file's size"
    return "of frames written"
