"""Where an engine process comes from: forked from a process that has the libraries loaded, or spawned fresh.

Every engine process needs torch, diffusers and transformers, a few seconds of loading (five of CPU on a small
machine). With a CPU-only torch on Linux the engines are forked from multiprocessing's fork server, which loads
them once (engine/service/preloaded.py) and forks each engine with them in place: an app's first engine still
waits for the load, but one started after a crash or a hang, the second engine of a pool (``--gpus 2``) and every
engine of a later client in the same process start in a fraction of a second.

A torch built for CUDA or ROCm spawns every engine: diffusers and transformers ask torch how many GPUs there are as
they load, and torch then refuses CUDA in any process forked after that ("Cannot re-initialize CUDA in forked
subprocess", seen on an H100 with the server's load, docs/data/engine-starts-h100.json). Which build is installed
is read from its version ("2.13.0+cpu"), without importing it.

An engine's environment is the app's as it is when the engine starts, however it started (``environment``; the
engine process puts it in place first). What the libraries read once, as they load (the variables of their families:
``LOADED_WITH``), a forked engine has from the server, so it is forked only while those are as the server started
with; once one differs, the engine is spawned and loads the libraries with the environment as it is now. Windows
and macOS spawn every engine (Windows cannot fork; macOS's system libraries do not survive it), and
``WAN_ENGINE_START=spawn`` makes a CPU-only Linux do the same.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import sys

# What the fork server imports before it forks its first engine.
PRELOAD = "engine.service.preloaded"
# "spawn": every engine process loads the libraries itself, as on Windows.
START_VARIABLE = "WAN_ENGINE_START"
# The families of variables that torch, its thread pools and device runtimes, diffusers, transformers and the Hub
# client may read once, as they load (a change in one of them means a forked engine would not see it).
LOADED_WITH = ("HF_", "HUGGINGFACE_", "TRANSFORMERS_", "DIFFUSERS_", "TOKENIZERS_", "ACCELERATE_", "TORCH", "PYTORCH_",
               "TRITON_", "OMP_", "KMP_", "MKL_", "OPENBLAS_", "GOMP_", "CUDA_", "NVIDIA_", "HIP_", "ROCM_", "ROCR_",
               "HSA_", "MIOPEN_", "NCCL_", "LD_", "PYTHON", "XDG_", "HOME", "TMPDIR", "WAN_")
_FORKSERVER_MAIN = "from multiprocessing.forkserver import main"


def engine_context(environ=None, torch_version: str | None = None):
    """The multiprocessing context an engine process starts from now (see the module's note; ``torch_version``:
    the installed torch's, read when not given)."""
    environ = os.environ if environ is None else environ
    spawn = mp.get_context("spawn")
    if not sys.platform.startswith("linux") or environ.get(START_VARIABLE, "").strip().lower() == "spawn":
        return spawn
    if not cpu_only_torch(torch_version):
        return spawn
    server_env = _fork_server_environment()
    if server_env is not None and loaded_with(server_env) != loaded_with(environ):
        return spawn
    forkserver = mp.get_context("forkserver")
    forkserver.set_forkserver_preload([PRELOAD])   # read when the server starts (the first engine); kept after
    return forkserver


def cpu_only_torch(version: str | None = None) -> bool:
    """Whether the installed torch (or one of ``version``) is a build without CUDA and ROCm."""
    if version is None:
        from importlib import metadata

        try:
            version = metadata.version("torch")
        except metadata.PackageNotFoundError:
            return False
    return version.partition("+")[2].startswith("cpu")


def environment(own: dict | None = None, environ=None) -> dict:
    """The whole environment an engine process starts with: the app's now, and the engine's own variables
    (``own``: which GPUs it sees, engine/service/pool.py) over it."""
    return {**(os.environ if environ is None else environ), **(own or {})}


def loaded_with(environ) -> dict:
    """The variables of ``environ`` that the libraries may read as they load."""
    return {name: value for name, value in environ.items() if name.upper().startswith(LOADED_WITH)}


def _fork_server_environment() -> dict | None:
    """The environment this process's fork server started with (None: no fork server runs yet)."""
    import psutil

    for child in psutil.Process().children():
        try:
            if _FORKSERVER_MAIN in " ".join(child.cmdline()):
                return child.environ()
        except psutil.Error:
            continue
    return None
