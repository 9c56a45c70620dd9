"""How fast this machine does the export's work: converting decoded frames to uint8 and encoding them as H.264,
each through the engine's own functions (engine/outputs/export.py). The machine's calibration takes these as
its export rates (``calibrate(..., export_rates=export_rates)``, engine/device/calibrate.py); the time model
divides the frames' work by them (engine/planning/timing.py)."""
from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from engine.device.calibrate import timer
from engine.device.hardware import DECIMAL_GB
from engine.outputs.export import to_uint8, write_mp4

# Frames of the H.264 encode: two counts, so ffmpeg's start (and the engine's frame count check) is told
# apart from the per-frame cost. A smooth moving picture, not noise: noise takes x264 several times longer
# than a generated video does.
_ENCODE = {"full": (832, 480, (8, 32)), "quick": (320, 192, (4, 12))}


def export_rates(quick: bool) -> dict:
    """The Calibration fields of the export: ``to_uint8_gbps``, and ``encode_megapixels_per_s`` with
    ``encode_fixed_s`` when there is a video encoder here."""
    return {"to_uint8_gbps": _to_uint8_gbps(quick), **_encode(quick)}


def _to_uint8_gbps(quick: bool) -> float:
    """The engine's float -> uint8 conversion of decoded frames (engine.outputs.export.to_uint8)."""
    import numpy as np

    frames = np.random.default_rng(0).random((4 if quick else 16, 240, 416, 3), dtype=np.float32)
    t = timer("cpu")(lambda: to_uint8(frames), 3, 1)
    return round(frames.nbytes / t / DECIMAL_GB, 3)


FIXED_TRIES = 5


def _seconds(work) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def _encode(quick: bool) -> dict:
    """H.264 encode through the engine's own writer (engine.outputs.export.write_mp4): ffmpeg's fixed cost
    and megapixels per second, from two clip lengths. Empty when there is no video encoder here."""
    import numpy as np

    try:
        import imageio_ffmpeg  # noqa: F401
    except ImportError:
        return {}
    width, height, counts = _ENCODE["quick" if quick else "full"]
    ys, xs = np.mgrid[0:height, 0:width].astype(np.float32)
    noise = np.random.default_rng(0).integers(0, 8, (height, width, 1), dtype=np.uint8)

    def clip(count: int) -> np.ndarray:
        frames = []
        for i in range(count):
            r = 127 + 120 * np.sin((xs + 6 * i) / 40.0)
            g = 127 + 120 * np.cos((ys - 4 * i) / 33.0)
            b = 127 + 120 * np.sin((xs + ys + 5 * i) / 57.0)
            frames.append(np.stack([r, g, b], axis=-1).astype(np.uint8) + noise)
        return np.stack(frames)

    times = {}
    with tempfile.TemporaryDirectory() as folder:
        tiny = clip(1)[:, :64, :64]
        write_mp4(tiny, Path(folder) / "warm.mp4", 16)     # ffmpeg's first start reads its binary
        fixed = statistics.median(_seconds(lambda: write_mp4(tiny, Path(folder) / "tiny.mp4", 16))
                                  for _ in range(FIXED_TRIES))
        for count in counts:
            frames = clip(count)
            times[count] = _seconds(lambda: write_mp4(frames, Path(folder) / f"clip{count}.mp4", 16))
    (short, long_) = counts
    # The fixed cost is a one-frame thumbnail's whole write, the median of a few (a process's start varies): the
    # two lengths' difference alone told it within 0.03-0.07 s from run to run on a 2-core CPU.
    per_frame = max((times[long_] - times[short]) / (long_ - short), (times[long_] - fixed) / long_, 1e-6)
    return {"encode_megapixels_per_s": round(width * height / per_frame / 1e6, 3),
            "encode_fixed_s": round(fixed, 3)}
