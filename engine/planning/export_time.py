"""The export's time: frames encoded as H.264 (a whole clip, or streamed beside the decode) and an extension's join.
Part of the time model (engine/planning/timing.py)."""
from __future__ import annotations

from engine.device.calibrate import Calibration

# A streamed export (engine/outputs/export.Mp4Stream) encodes while the decoder works; what is left after the
# last frame, against the whole clip's encode: 0.47-0.55 s of 0.74 s on an H200 (docs/data/speed-1.3b-h200.json).
STREAMED_EXPORT_SHARE = 0.7
# Its process started with the first frame: of its fixed cost (the calibration's encode_fixed_s, a one-frame
# thumbnail's whole write: 0.033-0.039 s on the project's 2-core CPU) only the closing is left after the last frame,
# 0.011-0.021 s there whatever the length, 9 to 241 frames (docs/data/small-work-cpu.json): the encoder keeps up with
# a CPU decode, and only the last latent frame's frames are left to encode.
STREAMED_FIXED_SHARE = 0.45
# Starting it (the process, its pipes) is done inside the decode: a streamed video's decode there had 0.05 s that
# did not grow with its frames, where a still's (not streamed) had none: this many times the fixed cost.
STREAM_START_FIXED = 1.4
# H.264 export when the encoder could not be measured here: 81 frames of 832x480 took 2.1 s on the H200
# machine's 16 cores (docs/reference-figures.md), about 15 megapixels a second.
DEFAULT_ENCODE_MPS = 15.0
DEFAULT_ENCODE_FIXED_S = 0.1


def process_start_seconds(cal: Calibration) -> float:
    """The export's fixed cost (an ffmpeg's start, a one-frame write and its check): the calibrated one, else the
    default; the unit the other ffmpeg work beside an encode is counted in."""
    return (cal.encode_fixed_s or 0.0) if cal.encode_megapixels_per_s else DEFAULT_ENCODE_FIXED_S


def export_seconds(pixels: int, cal: Calibration) -> tuple[float, str]:
    """A whole clip's encode: its pixels over the measured rate, plus the encoder's start and the file's check."""
    rate, source = ((cal.encode_megapixels_per_s, "measured here") if cal.encode_megapixels_per_s else
                    (DEFAULT_ENCODE_MPS, "not measured here: a 16-core CPU's rate"))
    fixed = process_start_seconds(cal)
    return pixels / (rate * 1e6) + fixed, (f"{pixels / 1e6:.0f} megapixels of H.264 at {rate:.1f} MP/s ({source}) "
                                           f"+ {fixed:.2f} s")


# A still is a PNG written whole (engine/outputs/export.py write_png): its pixels at PIL's rate on noise, the worst
# case (8.3-8.8 MP/s at 832x480 and 1280x720 on the project's 2-core CPU), and the file written safely, which took
# 0.037-0.042 s for a 64x64 still there, about the export's calibrated fixed cost (a one-frame thumbnail's write).
PNG_MPS = 8.5
STILL_WRITE_SHARE = 1.1


def still_seconds(pixels: int, cal: Calibration) -> tuple[float, str]:
    """A still's PNG: its pixels encoded and the file written."""
    write = STILL_WRITE_SHARE * process_start_seconds(cal)
    return pixels / (PNG_MPS * 1e6) + write, (f"a {pixels / 1e6:.2f} MP PNG at {PNG_MPS:g} MP/s + {write:.3f} s to "
                                              "write the file safely")


# An extension's colour match, per megapixel of its part on the CPU (engine/post/extend.py, measured on the 2-core
# CPU: 15 MP/s at 832x480); the part is read, matched and encoded again, the video's own streams copied.
COLOUR_MATCH_MPS = 15.0
# Its ffmpeg processes beside the encode (the video's last frame read, the part read, the streams joined) and their
# files: a 9-frame 64x64 join took 0.26-0.38 s on that CPU, about this many times the export's calibrated fixed cost
# (0.035 s) beside its encode.
JOIN_FIXED_COSTS = 7


def join_seconds(frames: int, width: int, height: int, cal: Calibration) -> tuple[float, str]:
    pixels = (frames - 1) * width * height
    encode, _ = export_seconds(pixels, cal)
    match = pixels / (COLOUR_MATCH_MPS * 1e6)
    processes = JOIN_FIXED_COSTS * process_start_seconds(cal)
    return encode + match + processes, (
        f"the part's {frames - 1} new frames colour-matched ({match:.2f} s at {COLOUR_MATCH_MPS:g} MP/s) and encoded "
        f"again ({encode:.2f} s), + {processes:.2f} s for ffmpeg's other processes and their files; the video's "
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
    fixed = process_start_seconds(calibration)
    share = 1 / ((frames - 1) // temporal + 1)
    left = share * (export - fixed) + STREAMED_FIXED_SHARE * fixed
    return left, how + (f"; streamed beside the decode on the CPU: the last latent frame's {share:.2f} of the encode "
                        f"and x{STREAMED_FIXED_SHARE} of its fixed cost left after the last frame"), \
        STREAM_START_FIXED * fixed
