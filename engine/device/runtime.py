"""Small device helpers: synchronising before reading the clock, measuring peaks, freeing memory."""
from __future__ import annotations

import gc
import threading
import time
from contextlib import contextmanager


def synchronize(device: str) -> None:
    """Wait for queued device work, so wall-clock timings are real."""
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        torch.cuda.synchronize()
    elif device.startswith("mps") and torch.backends.mps.is_available():
        torch.mps.synchronize()


def free_device_memory() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        torch.mps.empty_cache()


def release_memory() -> None:
    """After a model is dropped: its device memory, and its RAM, back to the system.

    Pinned RAM (the weights of an offloading plan) goes back to torch's pinned-memory cache when freed, not to
    the system, and the next plan would count it as taken: the cache is emptied. And the C library keeps freed
    small blocks for the process: it is asked to give them back (glibc's malloc_trim; elsewhere nothing)."""
    import torch

    free_device_memory()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        empty_host_cache = getattr(getattr(torch, "accelerator", None), "empty_host_cache", None) \
            or getattr(torch._C, "_host_emptyCache", None)
        if empty_host_cache is not None:
            empty_host_cache()
    trim_heap()


def trim_heap() -> None:
    """glibc's malloc_trim(0): freed heap blocks back to the system (a no-op where the C library has none)."""
    import ctypes
    import ctypes.util
    import sys

    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):   # musl and other C libraries: nothing to ask
        return
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    trim(0)


def reset_peak_vram() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()


def peak_vram_gb() -> float | None:
    import torch

    if torch.cuda.is_available():
        return round(torch.cuda.max_memory_allocated() / 1024 ** 3, 3)
    return None


class RamPeakSampler:
    """Samples this process's resident memory in a thread; ``peak_gb`` is the largest seen."""

    def __init__(self, interval: float = 0.05):
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        import psutil

        proc = psutil.Process()
        while True:
            self.peak = max(self.peak, proc.memory_info().rss)
            if self._stop.wait(self.interval):
                break

    @property
    def peak_gb(self) -> float:
        return round(self.peak / 1024 ** 3, 3)

    @contextmanager
    def running(self):
        self._thread = threading.Thread(target=self._sample, name="ram-peak", daemon=True)
        self._thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            self._thread.join()


# What the libraries say that is expected here and tells the user nothing: transformers' image processor works
# without torchvision (the app wants that); diffusers' context-parallel hooks leave the 1-D timestep whole (as
# they should) and call the parallel API experimental, on every split job; and the attention backends, on every job.
QUIET_NOTES = ("requires torchvision", "split will not be applied", "`enable_parallelism` is an experimental",
               "Attention backends are an experimental")


class _ExpectedNotes:
    """A logging filter that drops QUIET_NOTES."""

    @staticmethod
    def filter(record) -> bool:
        message = record.getMessage()
        return not any(note in message for note in QUIET_NOTES)


def load_libraries() -> None:
    """Import what every job needs (torch, diffusers' Wan pipelines, the encoders' classes) and quiet the
    libraries' own console output: their loading bars (progress reaches the page as events) and the notes that
    say nothing here (QUIET_NOTES; torch's deprecation of the all-gather that diffusers' split hooks call)."""
    import warnings

    import transformers

    library_logger = transformers.utils.logging.get_logger("transformers")   # sets up its console handler
    for handler in library_logger.handlers:
        handler.addFilter(_ExpectedNotes())
    import diffusers
    import torch  # noqa: F401

    for handler in diffusers.utils.logging.get_logger("diffusers").handlers:
        handler.addFilter(_ExpectedNotes())
    warnings.filterwarnings("ignore", message=r".*all_gather_tensor.* is deprecated", category=FutureWarning)

    for name in ("WanPipeline", "WanImageToVideoPipeline", "AutoencoderKLWan", "WanTransformer3DModel"):
        getattr(diffusers, name)
    for name in ("UMT5EncoderModel", "CLIPVisionModel"):
        getattr(transformers, name)
    diffusers.utils.logging.disable_progress_bar()
    transformers.utils.logging.disable_progress_bar()
    # The libraries' objects (about 420,000) are kept out of every later collection's walk: a collection (each
    # unload asks for one, and Python makes its own as jobs allocate) took 0.19 s on a 2-core CPU, now next to
    # nothing, and so does the process's exit; an engine forked from a loaded server leaves those pages shared.
    gc.freeze()


def clock() -> float:
    return time.perf_counter()
