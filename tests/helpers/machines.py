"""Machines the planner and the time model are tried on: hardware profiles, an H200's calibration, a slow one."""
from __future__ import annotations

from dataclasses import replace

from engine.device.calibrate import Calibration, calibrate
from engine.device.hardware import HardwareProfile
from engine.outputs.export_rates import export_rates
from engine.planning.planner import PlanRequest, plan_memory
from tests.conftest import CPU

HARDWARE = {
    # 64 GB unified memory split 48/16 by the BIOS (seed 002): RAM left to Windows is tiny.
    "strix-halo-48-16": HardwareProfile(backend="rocm", device_name="AMD Radeon 8060S", arch="gfx1151",
                                        vram_total_gb=48, vram_free_gb=47.5, ram_total_gb=16, ram_available_gb=12.5,
                                        unified_memory=True, os="windows"),
    "rtx3060-12-32": HardwareProfile(backend="cuda", device_name="RTX 3060", arch="sm_86", vram_total_gb=12,
                                     vram_free_gb=11.3, ram_total_gb=32, ram_available_gb=27, os="windows"),
    "rtx4060-laptop-8-32": HardwareProfile(backend="cuda", device_name="RTX 4060 Laptop", arch="sm_89",
                                           vram_total_gb=8, vram_free_gb=7.4, ram_total_gb=32, ram_available_gb=26,
                                           os="windows"),
    "m1-max-64": HardwareProfile(backend="mps", device_name="Apple M1 Max", arch="apple", vram_total_gb=64,
                                 vram_free_gb=50, ram_total_gb=64, ram_available_gb=50, unified_memory=True,
                                 os="macos"),
    "24gb-64": HardwareProfile(backend="cuda", device_name="RTX 4090", arch="sm_89", vram_total_gb=24,
                               vram_free_gb=23.2, ram_total_gb=64, ram_available_gb=58),
    "h200": HardwareProfile(backend="cuda", device_name="NVIDIA H200", arch="sm_90", vram_total_gb=139.8,
                            vram_free_gb=139, ram_total_gb=128, ram_available_gb=120),
}
T2V_13 = "Wan-AI/Wan2.1-T2V-1.3B-Diffusers"

# What calibrate("cuda", "bfloat16") measured on an H200 (torch 2.11, CUDA 13; docs/data/timing-h200.json):
# the device's rates from its "calibration"; the host's (copies, pinning, the CPU), which vary more from run
# to run (pageable copies 6.0-8.2 GB/s, pinning 1.4-2.8 GB/s), the median of its three calibrations.
H200_CALIBRATION = Calibration(
    device_name="NVIDIA H200", backend="cuda", torch_version="2.11.0+cu130", dtype="bfloat16",
    matmul_tflops=((1536, 749.1), (5120, 802.0)),
    attention_tflops=((1024, 273.0), (4096, 626.7), (16384, 685.6), (32768, 611.4)),
    conv3d_tflops=(("default", "float32", 96, 127.1), ("default", "float32", 192, 227.6),
                   ("default", "float32", 384, 200.8), ("default", "float32", 768, 297.4),
                   ("default", "bfloat16", 96, 228.5), ("default", "bfloat16", 192, 485.7),
                   ("default", "bfloat16", 384, 544.8), ("default", "bfloat16", 768, 615.1),
                   ("benchmark", "float32", 96, 127.6), ("benchmark", "float32", 192, 228.8),
                   ("benchmark", "float32", 384, 201.2), ("benchmark", "float32", 768, 293.7),
                   ("benchmark", "bfloat16", 96, 226.7), ("benchmark", "bfloat16", 192, 474.1),
                   ("benchmark", "bfloat16", 384, 529.7), ("benchmark", "bfloat16", 768, 602.4)),
    conv2d_tflops=(("default", "float32", 136, 139.6), ("default", "float32", 272, 230.5),
                   ("default", "float32", 768, 324.4), ("default", "bfloat16", 136, 300.4),
                   ("default", "bfloat16", 272, 379.2), ("default", "bfloat16", 768, 578.4),
                   ("benchmark", "float32", 136, 139.1), ("benchmark", "float32", 272, 231.0),
                   ("benchmark", "float32", 768, 322.2), ("benchmark", "bfloat16", 136, 289.1),
                   ("benchmark", "bfloat16", 272, 369.5), ("benchmark", "bfloat16", 768, 569.3)),
    memory_gbps=4204.8, cpu_matmul_tflops=2.02, to_uint8_gbps=1.565, h2d_pageable_gbps=6.21,
    h2d_pinned_gbps=55.0, d2h_gbps=1.54, pin_gbps=1.45)
H200 = HardwareProfile(backend="cuda", device_name="NVIDIA H200", arch="sm_90", vram_total_gb=139.8,
                       vram_free_gb=139.0, ram_total_gb=128, ram_available_gb=120, cpu_count=16,
                       torch_version="2.11.0+cu130", triton=True)
RTX_3060 = HardwareProfile(backend="cuda", device_name="NVIDIA GeForce RTX 3060", arch="sm_86",
                           vram_total_gb=12.0, vram_free_gb=11.5, ram_total_gb=32.0, ram_available_gb=28.0)


def plan_for(spec, width=832, height=480, frames=81, i2v=False, hardware=H200, **fields):
    """The planner's plan for this request, with the fields a measurement ran under."""
    plan = plan_memory(spec, PlanRequest(width, height, frames, i2v), hardware)
    return replace(plan, **fields)


def slow_calibration(folder, slower: float = 1e4, hardware=CPU) -> None:
    """This machine's calibration kept in ``folder`` for ``hardware`` (as the engine names it), every compute rate
    ``slower`` times slower than measured: a tiny job is predicted to take long."""
    measured = calibrate("cpu", "float32", quick=True, export_rates=export_rates)
    slow = replace(measured, device_name=hardware.device_name, backend=hardware.backend,
                   torch_version=hardware.torch_version,
                   matmul_tflops=tuple((k, v / slower) for k, v in measured.matmul_tflops),
                   attention_tflops=tuple((k, v / slower) for k, v in measured.attention_tflops),
                   conv3d_tflops=tuple((*k, v / slower) for *k, v in measured.conv3d_tflops))
    slow.save(folder)
