"""The export's time: frames encoded as H.264 (a whole clip, or streamed beside the decode) and an extension's join.
Part of the time model (engine/planning/timing.py)."""
from __future__ import annotations

from engine.device.calibrate import Calibration

# A streamed export (engine/outputs/export.Mp4Stream) encodes while the decoder works; what is left after the
# last frame, against the whole clip's encode: 0.47-0.55 s of 0.74 s on an H200 (docs/data/speed-1.3b-h200.json).
STREAMED_EXPORT_SHARE = 0.7
# Its process started with the first frame: of its fixed cost only the closing is left, 0.011-0.021 s of the
# calibrated 0.07 s on the project's 2-core CPU whatever the length, 9 to 241 frames (docs/data/small-work-cpu.json):
# there the encoder keeps up with a CPU decode, and only the last latent frame's frames are left to encode.
STREAMED_FIXED_SHARE = 0.2
# H.264 export when the encoder could not be measured here: 81 frames of 832x480 took 2.1 s on the H200
# machine's 16 cores (docs/reference-figures.md), about 15 megapixels a second.
DEFAULT_ENCODE_MPS = 15.0
DEFAULT_ENCODE_FIXED_S = 0.1


def export_seconds(pixels: int, cal: Calibration) -> tuple[float, str]:
    """A whole clip's encode: its pixels over the measured rate, plus the encoder's start and the file's check."""
    if cal.encode_megapixels_per_s:
        rate, fixed, source = cal.encode_megapixels_per_s, cal.encode_fixed_s or 0.0, "measured here"
    else:
        rate, fixed, source = DEFAULT_ENCODE_MPS, DEFAULT_ENCODE_FIXED_S, "not measured here: a 16-core CPU's rate"
    return pixels / (rate * 1e6) + fixed, (f"{pixels / 1e6:.0f} megapixels of H.264 at {rate:.1f} MP/s ({source}) "
                                           f"+ {fixed:.2f} s")


# An extension's colour match, per megapixel of its part on the CPU (engine/post/extend.py, measured on the 2-core
# CPU: 15 MP/s at 832x480); the part is read, matched and encoded again, the video's own streams copied.
COLOUR_MATCH_MPS = 15.0
# Its ffmpeg processes beside the encode (the video's last frame read, the part read, the streams joined), each
# costing about what the export's calibrated fixed cost is: a 9-frame 64x64 join took 0.26-0.29 s on that CPU
# against 0.07 s of fixed cost a process.
JOIN_PROCESSES = 3


def join_seconds(frames: int, width: int, height: int, cal: Calibration) -> tuple[float, str]:
    pixels = (frames - 1) * width * height
    encode, _ = export_seconds(pixels, cal)
    match = pixels / (COLOUR_MATCH_MPS * 1e6)
    fixed = cal.encode_fixed_s if cal.encode_megapixels_per_s and cal.encode_fixed_s else DEFAULT_ENCODE_FIXED_S
    processes = JOIN_PROCESSES * fixed
    return encode + match + processes, (
        f"the part's {frames - 1} new frames colour-matched ({match:.2f} s at {COLOUR_MATCH_MPS:g} MP/s) and encoded "
        f"again ({encode:.2f} s), + {processes:.2f} s for ffmpeg's other {JOIN_PROCESSES} processes; the video's "
        "streams copied")


def streamed_export(export: float, how: str, frames: int, temporal: int, device: str,
                    calibration: Calibration) -> tuple[float, str, float]:
    """(the export's seconds left after the last frame, how, the seconds of its start counted in the decode) of an
    export streamed beside the decode whose whole encode is ``export``."""
    if device != "cpu":   # a GPU decode: a share of the encode is left (the H200's figure)
        return (export * STREAMED_EXPORT_SHARE,
                how + f"; streamed beside the decode, x{STREAMED_EXPORT_SHARE} left after the last frame", 0.0)
    # On the CPU the decode and the encoder share the cores and the encoder keeps up: only the last latent frame's
    # frames and the closing are left; its process started inside the decode.
    fixed = (calibration.encode_fixed_s if calibration.encode_megapixels_per_s else DEFAULT_ENCODE_FIXED_S) or 0.0
    share = 1 / ((frames - 1) // temporal + 1)
    left = share * (export - fixed) + STREAMED_FIXED_SHARE * fixed
    return left, how + (f"; streamed beside the decode on the CPU: the last latent frame's {share:.2f} of the encode "
                        f"and x{STREAMED_FIXED_SHARE} of its fixed cost left after the last frame"), \
        (1 - STREAMED_FIXED_SHARE) * fixed
