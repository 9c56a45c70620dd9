"""The rates a phase's work is divided by, read from this machine's calibration (engine/device/calibrate.py):
matrix products and attention by their size, convolutions by their width, copies by their kind. Between the
sizes measured a rate is interpolated in log(size); outside them it is the nearest one measured."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from engine.device.calibrate import Calibration
from engine.device.hardware import DECIMAL_GB
from engine.planning.plan import Plan


def interpolate(points: Sequence[tuple[float, float]], x: float) -> float:
    """Linear in log(x) between measured points, the nearest end outside them (no extrapolation)."""
    pts = sorted(points)
    if not pts:
        raise ValueError("no measured points")
    if x <= pts[0][0]:
        return pts[0][1]
    if x >= pts[-1][0]:
        return pts[-1][1]
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x0 <= x <= x1:
            share = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
            return y0 + share * (y1 - y0)
    return pts[-1][1]


@dataclass(frozen=True)
class Rates:
    """The rates a plan computes at (device or CPU), in FLOP/s and bytes/s, and where they come from."""
    matmul: Sequence[tuple[float, float]]
    attention: Sequence[tuple[float, float]]
    memory: float
    note: str = ""

    def matmul_at(self, dim: int) -> float:
        return interpolate(self.matmul, dim) * 1e12

    def attention_at(self, tokens: int) -> float:
        return interpolate(self.attention, tokens) * 1e12


def device_rates(plan: Plan, cal: Calibration) -> Rates:
    """The rates the plan computes at: its device's, or the CPU's."""
    if plan.device == "cpu" and cal.backend != "cpu":
        # A CPU plan with a GPU's calibration: only the CPU's matmul rate is known; use it throughout.
        cpu = ((1, cal.cpu_matmul_tflops),)
        return Rates(cpu, cpu, cal.memory_gbps * DECIMAL_GB / 20, "CPU rates guessed from its matmul rate")
    return Rates(cal.matmul_tflops, cal.attention_tflops, cal.memory_gbps * DECIMAL_GB)


def copy_gbps(cal: Calibration, pinned: bool) -> tuple[float, str]:
    """Host -> device rate; without a measured one (unified memory, Apple), a copy within memory."""
    rate = cal.h2d_pinned_gbps if pinned else cal.h2d_pageable_gbps
    if rate:
        return rate, ("pinned" if pinned else "pageable")
    return cal.memory_gbps / 2, "in memory"


def bytes_per(dtype: str) -> int:
    return 4 if dtype == "float32" else 2


def conv_rate(cal: Calibration, mode: str, dtype: str, width: int, taps: int = 27) -> float:
    """TFLOP/s of a decoder convolution at ``width`` channels: a 3x3 one (taps 9) at the measured conv2d rate
    when there is one, the others at the conv3d rate; the set-up and dtype asked for, else the nearest."""
    tables = ([cal.conv2d_tflops] if taps == 9 and cal.conv2d_tflops else []) + [cal.conv3d_tflops]
    for table in tables:
        for want in ((mode, dtype), ("default", dtype), (mode, cal.dtype), ("default", cal.dtype),
                     ("default", "float32")):
            points = [(c, v) for m, d, c, v in table if (m, d) == want]
            if points:
                return interpolate(points, width)
    raise ValueError("the calibration has no convolution rates")

