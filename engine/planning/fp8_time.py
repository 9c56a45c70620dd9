"""The transformer's block linears in float8 (engine/run/speedups.py ``fp8_linears``): what a pass takes then, for
the time model (engine/planning/timing.py), from the calibration's float8 matmul rate where it was measured, else
from the measured factor of a whole pass."""
from __future__ import annotations

from dataclasses import replace

from engine.device.calibrate import Calibration
from engine.models.spec import ModelSpec
from engine.planning.rates import Rates, interpolate

# The block linears in float8 (torchao, compiled) against compiled bfloat16, a 1.3B step at 32,760 tokens: 0.501 s
# against 0.532 s on an H100 (docs/data/speed-past-bf16-h100.json; a pass on an H200: 0.484 s against 0.520 s).
# Compiling them took 184 s at a new size, not the 11-17 s of the 16-bit blocks.
FP8_COMPUTE_PASS = 0.94
FP8_COMPILE_FIRST_S = 180.0
# With the calibration's float8 matmul rate the linears are counted at it, plus each quantised linear's input cast
# to float8 once a pass, as memory work at this many bytes an element (compiled, the cast is mostly fused into the
# kernel that makes the input). Fitted: with 1.5 a compiled 1.3B pass at 32,760 tokens is predicted at 0.927 of
# bfloat16's on an H200 and 0.948 on an H100 (calibrations in docs/data/light-vae-h200.json and
# speed-light-vae-h100.json), measured 0.931 and 0.940.
FP8_QUANT_BYTES = 1.5


def fp8_linears(one, spec: ModelSpec, tokens: int, rates: Rates, cal: Calibration) -> tuple[object, str]:
    """A pass with the blocks' linears in float8: at the calibrated float8 matmul rate, plus casting their inputs;
    without that rate (a calibration from before it, or none measured), the whole pass times a measured factor."""
    if not cal.fp8_matmul_tflops:
        return (replace(one, linear=one.linear * FP8_COMPUTE_PASS, attention=one.attention * FP8_COMPUTE_PASS,
                        elementwise=one.elementwise * FP8_COMPUTE_PASS),
                f", float8 linears: x{FP8_COMPUTE_PASS} a pass (measured on an H100)")
    shape = spec.transformer
    rate = interpolate(cal.fp8_matmul_tflops, shape.dim) * 1e12
    speedup = rate / rates.matmul_at(shape.dim)
    # Each block's float8 linears take the video tokens in: self-attention's q, k, v and out, cross-attention's
    # q and out (6 of the width), the feed-forward's two (the width and its inner width).
    quantised = tokens * shape.layers * (6 * shape.dim + shape.ffn)
    cast = quantised * FP8_QUANT_BYTES / rates.memory
    return (replace(one, linear=one.linear / speedup + cast),
            f", float8 linears at {rate / 1e12:.0f} TFLOP/s (x{speedup:.2f}) +{cast:.3f} s casting their inputs")

