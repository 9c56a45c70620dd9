"""How busy each GPU is right now, as its driver says: NVML on NVIDIA (the nvidia-ml-py package), amdsmi or else
the rocm-smi tool on AMD.

Read in the app's process when Prometheus scrapes (engine/service/metrics.py), never in an engine process, and never
required: without the library, the driver or a GPU (a CPU-only machine, a Mac), a reading is empty and the metric is
absent. The GPUs are the machine's numbers, as the engine pool gives them (engine/service/pool.py: the GPUs the app
sees, CUDA_VISIBLE_DEVICES applied); the drivers' tools count every GPU of the machine, so a number is turned into
the driver's own through the app's CUDA_VISIBLE_DEVICES (HIP_VISIBLE_DEVICES on AMD). A GPU named there by its UUID is
found by it; one named by a number is the driver's GPU of that number, which is CUDA's when CUDA_DEVICE_ORDER is
PCI_BUS_ID or the machine's GPUs are alike (CUDA's default puts the fastest first, the drivers their PCI order).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from typing import Mapping, Sequence

# The variables that say which of the machine's GPUs the app sees, in its order, by backend (the first one set).
VISIBLE_ENV = {"cuda": ("CUDA_VISIBLE_DEVICES",), "rocm": ("HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")}
# How long rocm-smi may take to answer before a scrape goes on without it.
ROCM_SMI_TIMEOUT_S = 2.0
# rocm-smi --showuse --json: each card's busy share, in per cent.
ROCM_SMI_USE = "GPU use (%)"


def driver_ids(gpus: Sequence[int], backend: str, environ: Mapping[str, str] | None = None) -> dict[int, str]:
    """The driver's name of each of ``gpus`` (the machine's numbers as the app sees them): its entry in the visible
    devices' variable (a number or a UUID), else the number itself; a GPU beyond that list is left out."""
    environ = os.environ if environ is None else environ
    listed = next((environ[name] for name in VISIBLE_ENV.get(backend, ()) if environ.get(name, "").strip()), "")
    visible = [part.strip() for part in listed.split(",") if part.strip()]
    if not visible:
        return {gpu: str(gpu) for gpu in gpus}
    return {gpu: visible[gpu] for gpu in gpus if 0 <= gpu < len(visible)}


def rocm_smi_ratios(output: str) -> dict[int, float]:
    """Each card's busy share (0 to 1) from ``rocm-smi --showuse --json`` (``{"card0": {"GPU use (%)": "12"}}``;
    some versions print warnings before the JSON); a card without a number is left out."""
    start = output.find("{")
    try:
        cards = json.loads(output[start:]) if start >= 0 else {}
    except ValueError:
        return {}
    ratios = {}
    for card, values in cards.items() if isinstance(cards, dict) else ():
        try:
            ratios[int(card.removeprefix("card"))] = float(values[ROCM_SMI_USE]) / 100
        except (TypeError, ValueError, KeyError):
            continue
    return ratios


def _open_nvml():
    """pynvml, initialised; None where it is not installed or finds no NVIDIA driver."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:   # ImportError, or NVMLError: no library, no driver, no GPU
        return None


def _open_amdsmi():
    """amdsmi (ROCm's Python library), initialised; None where it is not installed or finds no AMD GPU."""
    try:
        import amdsmi

        amdsmi.amdsmi_init()
        return amdsmi
    except Exception:   # ImportError, or AmdSmiException: no library, no driver
        return None


def _nvml_ratio(pynvml, device: str) -> float | None:
    """The busy share of NVML's GPU ``device`` (a number or a UUID) over its last sample period; None when NVML
    cannot say (a MIG instance, a GPU that is gone)."""
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(int(device)) if device.isdigit() else \
            pynvml.nvmlDeviceGetHandleByUUID(device)
        return pynvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100
    except Exception:   # NVMLError of any kind: this GPU has no reading
        return None


def _amdsmi_ratio(amdsmi, handles: list, device: str) -> float | None:
    """The graphics engine's busy share of amdsmi's GPU number ``device``; None when it cannot say."""
    if not device.isdigit() or int(device) >= len(handles):
        return None
    try:
        activity = amdsmi.amdsmi_get_gpu_activity(handles[int(device)]).get("gfx_activity")
    except Exception:   # AmdSmiException: this GPU has no reading
        return None
    return activity / 100 if isinstance(activity, (int, float)) else None


class GpuUtilization:
    """Reads the GPUs' utilisation through the driver's library, opened at the first reading and kept open (one per
    app: engine/service/metrics.py holds it)."""

    def __init__(self, environ: Mapping[str, str] | None = None):
        self._environ = environ
        self._lock = threading.Lock()
        self._libraries: dict[str, object] = {}   # "nvml" or "amdsmi" -> the opened module, or None: not here

    def read(self, backend: str, gpus: Sequence[int]) -> dict[int, float]:
        """Each of ``gpus``' busy share now (0 to 1) on ``backend`` ("cuda" or "rocm"; nothing on "cpu" or "mps"),
        by the machine's GPU number; a GPU the driver says nothing of is left out."""
        ids = driver_ids(gpus, backend, self._environ)
        if backend == "cuda":
            return self._read_nvml(ids)
        if backend == "rocm":
            return self._read_amd(ids)
        return {}

    def _library(self, name: str, opener):
        with self._lock:
            if name not in self._libraries:
                self._libraries[name] = opener()
            return self._libraries[name]

    def _read_nvml(self, ids: dict[int, str]) -> dict[int, float]:
        pynvml = self._library("nvml", _open_nvml)
        if pynvml is None:
            return {}
        ratios = {gpu: _nvml_ratio(pynvml, device) for gpu, device in ids.items()}
        return {gpu: ratio for gpu, ratio in ratios.items() if ratio is not None}

    def _read_amd(self, ids: dict[int, str]) -> dict[int, float]:
        """amdsmi where it is installed, else the rocm-smi tool where it is on the PATH."""
        amdsmi = self._library("amdsmi", _open_amdsmi)
        if amdsmi is not None:
            try:
                handles = list(amdsmi.amdsmi_get_processor_handles())
            except Exception:   # AmdSmiException: no GPU to read
                handles = []
            ratios = {gpu: _amdsmi_ratio(amdsmi, handles, device) for gpu, device in ids.items()}
            return {gpu: ratio for gpu, ratio in ratios.items() if ratio is not None}
        cards = _rocm_smi()
        return {gpu: cards[int(device)] for gpu, device in ids.items() if device.isdigit() and int(device) in cards}

    def close(self) -> None:
        """Let go of the drivers' libraries (a later reading opens them again)."""
        with self._lock:
            libraries, self._libraries = self._libraries, {}
        for name, library in libraries.items():
            try:
                if name == "nvml" and library is not None:
                    library.nvmlShutdown()
                elif name == "amdsmi" and library is not None:
                    library.amdsmi_shut_down()
            except Exception:   # already shut down, or the driver went away
                pass


def _rocm_smi() -> dict[int, float]:
    """Each card's busy share as the rocm-smi tool says; nothing where it is missing, fails or is slow."""
    tool = shutil.which("rocm-smi")
    if tool is None:
        return {}
    try:
        done = subprocess.run([tool, "--showuse", "--json"], capture_output=True, text=True,
                              timeout=ROCM_SMI_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return {}
    return rocm_smi_ratios(done.stdout) if done.returncode == 0 else {}
