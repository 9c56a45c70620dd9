"""Hardware detection: what device, how much memory, which backend.

Nothing here runs at import time; ``detect_hardware`` probes when called
(in the worker process, or for ``app.py doctor``).
"""
from __future__ import annotations

import importlib.util
import json
import platform
from dataclasses import asdict, dataclass, fields
from pathlib import Path

GIB = 1024 ** 3   # bytes in a GiB: the app's one definition (every "GB" it shows is GiB)
# 10^9 bytes: the unit of copy and disk rates (GB/s), as hardware sheets give them, and of nothing else.
DECIMAL_GB = 1e9
BACKENDS = ("cuda", "rocm", "mps", "cpu")
OSES = ("windows", "linux", "macos")
# AMD integrated GPUs (APUs) share system memory with the CPU.
AMD_APU_ARCHS = ("gfx1151", "gfx1150", "gfx1103", "gfx1036", "gfx1035", "gfx90c")


class HardwareError(ValueError):
    """A hardware description (JSON) is malformed."""


@dataclass(frozen=True)
class GpuDevice:
    """One GPU of the machine, numbered as the machine numbers them (``CUDA_VISIBLE_DEVICES`` applied)."""
    index: int
    name: str
    total_gb: float
    free_gb: float

    @classmethod
    def from_dict(cls, data) -> "GpuDevice":
        if not isinstance(data, dict) or set(data) != {f.name for f in fields(cls)}:
            raise HardwareError(f"each of hardware field 'devices' must be an object with index, name, total_gb "
                                f"and free_gb, got {data!r}")
        index, name = data["index"], data["name"]
        sizes = [data["total_gb"], data["free_gb"]]
        if not isinstance(index, int) or isinstance(index, bool) or index < 0 or not isinstance(name, str) or \
                any(not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0 for v in sizes):
            raise HardwareError(f"hardware field 'devices' has a malformed entry: {data!r}")
        return cls(index, name, float(sizes[0]), float(sizes[1]))


@dataclass(frozen=True)
class HardwareProfile:
    backend: str
    device_name: str
    arch: str = ""
    vram_total_gb: float = 0.0
    vram_free_gb: float = 0.0
    ram_total_gb: float = 0.0
    ram_available_gb: float = 0.0
    unified_memory: bool = False
    os: str = "linux"
    cpu_count: int = 1
    torch_version: str = ""
    triton: bool = False       # Triton imports here: the transformer can be compiled
    torchao: bool = False      # torchao is installed: the transformer's linears can compute in float8
    attention: str = ""        # the fastest attention backend measured on this machine ("": not measured)
    # Every GPU of the machine, this engine's own first (its device 0); () on a CPU or Mac. The sizes above
    # are the first one's.
    devices: tuple[GpuDevice, ...] = ()
    # The collective backend a job split across GPUs uses here (engine/run/parallel.py): "nccl" (RCCL on ROCm)
    # on GPUs, "gloo" for CPU engines, "" where this PyTorch has none (no NCCL: Windows; no torch.distributed).
    collectives: str = "gloo"
    # Free space where a disk rung would write its copy of the transformer (the models folder's disk); -1: not
    # known (the page's copy: the engine plans with the real figure when the job runs).
    disk_free_gb: float = -1.0
    # The sizes the transformer's blocks were compiled at on this machine before, their kernels kept in the app's
    # compile cache (engine/device/compile_cache.py; keys: engine/planning/speed.py ``compile_key``): compiling
    # one of them again costs seconds, not the first compile's tens.
    compiled_sizes: tuple[str, ...] = ()

    @property
    def device(self) -> str:
        """The torch device string for this backend."""
        return {"cuda": "cuda", "rocm": "cuda", "mps": "mps"}.get(self.backend, "cpu")

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_dict(cls, data: dict) -> "HardwareProfile":
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise HardwareError(f"unknown hardware field(s): {', '.join(unknown)}; allowed: {', '.join(known)}")
        for required in ("backend", "device_name"):
            if required not in data:
                raise HardwareError(f"hardware field '{required}' is required")
        values = {}
        for name, value in data.items():
            if name == "compiled_sizes" and isinstance(value, (list, tuple)):
                values[name] = tuple(str(key) for key in value)
                continue
            if name == "devices":
                if not isinstance(value, (list, tuple)):
                    raise HardwareError(f"hardware field 'devices' must be a list, got {value!r}")
                values[name] = tuple(GpuDevice.from_dict(d) for d in value)
                continue
            default = known[name].default
            expected = type(default) if name not in ("backend", "device_name") else str
            if expected is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            if not isinstance(value, expected) or (expected is not bool and isinstance(value, bool)):
                raise HardwareError(f"hardware field '{name}' must be {expected.__name__}, got {value!r}")
            values[name] = value
        if values["backend"] not in BACKENDS:
            raise HardwareError(f"hardware field 'backend' must be one of {', '.join(BACKENDS)}")
        if values.get("os", "linux") not in OSES:
            raise HardwareError(f"hardware field 'os' must be one of {', '.join(OSES)}")
        return cls(**values)

    @classmethod
    def from_file(cls, path: Path) -> "HardwareProfile":
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise HardwareError(f"cannot read hardware file {path}: {exc}") from exc
        if not isinstance(data, dict):
            raise HardwareError(f"{path}: must hold a JSON object")
        if isinstance(data.get("hardware"), dict) and "app" in data:   # a whole `app.py doctor --json` report
            data = data["hardware"]
        return cls.from_dict(data)

    @property
    def gpu_count(self) -> int:
        """How many GPUs the machine has (one for a profile that lists none but has a GPU backend)."""
        return len(self.devices) or (0 if self.backend in ("cpu", "mps") else 1)

    def summary(self) -> str:
        if self.backend == "cpu":
            return f"CPU only ({self.cpu_count} cores), {self.ram_total_gb:.0f} GB RAM"
        unified = ", unified memory" if self.unified_memory else ""
        arch = f" [{self.arch}]" if self.arch else ""
        more = f"; {len(self.devices)} GPUs in all" if len(self.devices) > 1 else ""
        return (f"{self.device_name}{arch} via {self.backend.upper()}, {self.vram_total_gb:.1f} GB device memory"
                f" ({self.vram_free_gb:.1f} free){unified}; {self.ram_total_gb:.0f} GB RAM{more}")


def _os_name() -> str:
    system = platform.system().lower()
    return {"darwin": "macos", "windows": "windows"}.get(system, "linux")


def can_compile(device: str, os_name: str) -> tuple[bool, str]:
    """Whether torch.compile can build kernels for the transformer here, and why (not).

    ``device`` is the hardware backend ("cuda", "rocm", "mps", "cpu"), ``os_name`` "linux", "windows" or "macos".
    It needs a CUDA or ROCm GPU and a Triton that torch can use with it (``has_triton``: the package imports
    and the GPU is one Triton supports); ROCm on Windows has no Triton.
    """
    kind = device.split(":")[0].lower()
    if kind in ("cpu", "mps"):
        return False, f"compilation is used on CUDA and ROCm GPUs only, not on {kind.upper()}"
    if kind not in ("cuda", "rocm"):
        return False, f"unknown device {device!r}"
    if os_name not in ("linux", "windows"):
        return False, f"compilation is used on Linux and Windows only, not on {os_name}"
    if kind == "rocm" and os_name == "windows":
        return False, "ROCm on Windows has no Triton, so torch.compile cannot build kernels"
    if importlib.util.find_spec("triton") is None:
        package = "triton-windows" if os_name == "windows" else "triton"
        return False, f"Triton is not installed (the {package} package)"
    import torch.utils._triton

    if not torch.utils._triton.has_triton():
        return False, "Triton is installed but torch cannot use it with this GPU (it needs one Triton supports)"
    return True, f"torch.compile with Triton on {kind.upper()} ({os_name})"



def visible_index(position: int) -> int:
    """The machine's number of the GPU this process sees at ``position``: an engine process sees the GPUs in its
    own order (its own GPU first), and the app tells it their numbers in WAN_GPU_ORDER (engine/service/pool.py)."""
    import os

    order = [part.strip() for part in os.environ.get("WAN_GPU_ORDER", "").split(",") if part.strip()]
    if position < len(order) and order[position].isdigit():
        return int(order[position])
    return position


def collectives_here(device: str) -> str:
    """The collective backend a split job's ranks use on ``device`` ("cuda" or "cpu") with this PyTorch: NCCL
    (RCCL on ROCm) on GPUs, gloo on the CPU; "" where there is none. gloo cannot stand in on GPUs: its gather of
    GPU tensors, which every split step uses, crashes the process (docs/data/collectives-probe-h200.json), and
    PyTorch for Windows has no NCCL, so there a job runs on one GPU."""
    import torch.distributed as dist

    if not dist.is_available():
        return ""
    if device == "cuda":
        return "nccl" if dist.is_nccl_available() else ""
    return "gloo"


def _gpu(position: int) -> GpuDevice:
    import torch

    free, total = torch.cuda.mem_get_info(position)
    return GpuDevice(visible_index(position), torch.cuda.get_device_properties(position).name,
                     round(total / GIB, 2), round(free / GIB, 2))


def detect_hardware() -> HardwareProfile:
    """Probe the machine (imports torch; initialises the GPU driver if there is one)."""
    import os

    import psutil
    import torch

    mem = psutil.virtual_memory()
    common = dict(
        ram_total_gb=round(mem.total / GIB, 2), ram_available_gb=round(mem.available / GIB, 2),
        os=_os_name(), cpu_count=os.cpu_count() or 1, torch_version=str(torch.__version__),
    )
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        free, total = torch.cuda.mem_get_info(0)
        devices = tuple(_gpu(i) for i in range(torch.cuda.device_count()))
        if getattr(torch.version, "hip", None):
            arch = getattr(props, "gcnArchName", "").split(":")[0]
            backend, unified = "rocm", arch in AMD_APU_ARCHS
        else:
            arch, backend = f"sm_{props.major}{props.minor}", "cuda"
            unified = bool(getattr(props, "is_integrated", False))
        return HardwareProfile(
            backend=backend, device_name=props.name, arch=arch,
            vram_total_gb=round(total / GIB, 2), vram_free_gb=round(free / GIB, 2),
            unified_memory=unified, triton=can_compile(backend, common["os"])[0], devices=devices,
            torchao=importlib.util.find_spec("torchao") is not None,
            collectives=collectives_here("cuda"), **common)
    if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        return HardwareProfile(
            backend="mps", device_name=platform.processor() or "Apple GPU", arch="apple",
            vram_total_gb=common["ram_total_gb"], vram_free_gb=common["ram_available_gb"],
            unified_memory=True, **common)
    return HardwareProfile(backend="cpu", device_name=platform.processor() or platform.machine(),
                           collectives=collectives_here("cpu"), **common)
