"""The engine process's side of the pipes: load the libraries, say Ready, then run the commands the app sends
(engine/service/commands.py) while a thread of its own answers the status channel, during a job too.
engine/service/worker.py is the app's side: it starts this process, and starts a fresh one when it dies."""
from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass

from engine.device.hardware import HardwareProfile
from engine.device.usage import EngineStarting
from engine.models.loras import LORA_EXPERTS
from engine.service.commands import PONG, Ask, DecodeSaved, PostOutput, Ready, RunJob, Stop, Unload, Unloaded
from engine.service.model_files import LoadedFiles

# Applied in the worker before torch loads: flash attention on ROCm (AOTriton); MIOpen's quick
# kernel search, where it still runs (its exhaustive search costs minutes per new VAE shape); and an
# allocator that grows segments instead of fragmenting (CUDA and ROCm read the same variable).
PLATFORM_ENV = {
    "TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL": "1",
    "MIOPEN_FIND_MODE": "FAST",
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
}


@dataclass
class _Starting:
    """The engine process while it loads its libraries; ``engine`` is set once it can take jobs."""
    since: float
    engine: object = None


def _serve_status(conn, state: _Starting) -> None:
    """Answer memory questions from the app while the main thread starts up or runs jobs (a daemon thread)."""
    while True:
        try:
            question = conn.recv()
        except (EOFError, OSError):
            return
        engine = state.engine
        if question is Ask.PING:   # the client's watchdog: is this process alive?
            reply = PONG
        elif engine is None:
            reply = EngineStarting(round(time.monotonic() - state.since, 1))
        elif question is Ask.HARDWARE:   # probed once before the engine said it was ready
            reply = engine.hardware
        elif question is Ask.LOADED:
            reply = _loaded_files(engine)
        else:
            reply = _memory(engine)
        try:
            conn.send(reply)
        except (BrokenPipeError, OSError):
            return


def _memory(engine):
    """What the engine holds now (EngineMemory), or the error's words. Its own function, so that the loaded model
    it looks at is referenced only while it answers: kept in the status loop's variables, it stayed in memory
    beside the next model after a swap (both on the device at once)."""
    from engine.device.usage import engine_memory

    loaded = engine.loaded
    hardware = engine.hardware
    try:
        return engine_memory(hardware.backend, hardware.device_name,
                             loaded.model.ref if loaded else None, loaded.plan.strategy if loaded else None)
    except Exception as exc:   # never let a status question take the engine down
        return f"{type(exc).__name__}: {exc}"


def _loaded_files(engine) -> LoadedFiles | str:
    """The files the engine's loaded pipeline holds (engine/service/model_files.py's LoadedFiles; none loaded: no
    paths), or what went wrong while it was read (a job may change the pipeline meanwhile)."""
    loaded = engine.loaded
    if loaded is None:
        return LoadedFiles(None, ())
    try:
        from engine.run.lora import adapter_name, loaded_adapters
        from engine.settings.loras import lora_folder, listed_lora_files

        adapters = set(loaded_adapters(loaded.pipe))
        folder = lora_folder(engine.models_dir)
        loras = [str(folder / name) for name in listed_lora_files(engine.models_dir)
                 if any(adapter_name(str(folder / name), expert) in adapters for expert in LORA_EXPERTS)]
        files = [file[0] for file in loaded.plan.transformer_files if file]
        return LoadedFiles(loaded.model.ref, (str(loaded.model.folder), *files, *loras,
                                              *map(str, loaded.fast_decoders), *map(str, loaded.light_vaes)))
    except Exception as exc:   # never let a status question take the engine down
        return f"{type(exc).__name__}: {exc}"


def _plain_progress_lock() -> None:
    """tqdm (diffusers' progress bars, off here) makes a multiprocessing lock on first use: a named semaphore that
    this process's quick exit (Stop) never unlinks, which the app's resource tracker then reports as leaked. A
    thread lock does as well in one process."""
    try:
        from tqdm import tqdm
    except ImportError:
        return
    tqdm.set_lock(threading.RLock())


def one_at_a_time(send):
    """``send`` (a pipe's) made safe to call from several threads: the job's thread sends its events while the live
    preview's thread sends the previews it encodes (engine/run/preview.py), and a pipe's messages interleaved byte by
    byte reach the app as garbage ("invalid load key"), failing the job and leaving its page at the step it showed."""
    lock = threading.Lock()

    def locked(message) -> None:
        with lock:
            send(message)
    return locked


def run_engine_process(conn, status_conn, cancel_event, models_dir: str, hardware: HardwareProfile | None,
                 options: dict, env: dict | None = None) -> None:
    """Entry point of the worker process: load the libraries, say so, then serve requests until told to stop.
    ``env``: the whole environment the engine runs with (the app's when it started the engine, with the engine's
    own variables over it: which GPUs it sees, in which order; engine/service/starts.py), put in place before
    torch initialises a device."""
    # A crash in native code (a driver, a collective) prints each thread's Python stack to the console, so the
    # report the page asks for says where it happened.
    faulthandler.enable()
    # A terminal's Ctrl-C reaches every process of its group: the app cancels the job through the pipe (the job
    # stops at its next step and says so), so the engine must not die of it halfway through a step.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Platform settings must be in place before torch initialises the device.
    if env is not None:   # a forked engine has the fork server's environment until now
        os.environ.clear()
        os.environ.update(env)
    for name, value in PLATFORM_ENV.items():
        os.environ.setdefault(name, value)
    if options.get("outputs_dir"):   # torch.compile's kernels kept beside the outputs, for later processes
        from engine.device.compile_cache import cache_env

        for name, value in cache_env(options["outputs_dir"]).items():
            os.environ.setdefault(name, value)
    state = _Starting(time.monotonic())
    threading.Thread(target=_serve_status, args=(status_conn, state), name="engine-status", daemon=True).start()
    from engine.device.runtime import load_libraries

    load_libraries()   # torch, diffusers and transformers: seconds that belong to no job's load
    _plain_progress_lock()
    from engine.run.engine import Engine

    engine = Engine(models_dir, hardware, **options)
    engine.hardware   # the device is probed (and its driver started) now, not during the first job
    state.engine = engine
    conn.send(Ready(time.monotonic() - state.since))
    send = one_at_a_time(conn.send)
    while True:
        try:
            command = conn.recv()
        except EOFError:
            return
        if isinstance(command, RunJob):
            engine.run(command.request, command.job_id, send, cancel_event.is_set, command.timings,
                       group=command.group)
        elif isinstance(command, DecodeSaved):
            engine.decode_saved(command.path, command.job_id, send, tiled=command.tiled, on_cpu=command.on_cpu,
                                timings=command.timings, should_cancel=cancel_event.is_set)
        elif isinstance(command, PostOutput):
            engine.post_output(command.path, command.step, command.factor, command.job_id, send,
                               cancel_event.is_set, timings=command.timings)
        elif isinstance(command, Unload):
            engine.unload()
            send(Unloaded())
        elif isinstance(command, Stop):
            # Nothing here needs tearing down (the OS frees the memory and the device): exiting at once saves
            # the seconds the interpreter spends unloading torch.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
