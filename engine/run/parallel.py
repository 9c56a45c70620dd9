"""One job over several engine processes, one per GPU (context parallel through diffusers).

The pool sends the same request to ``size`` engine processes, each with its ``RankGroup``. Each rank loads the
model and encodes the prompt as a one-GPU job would (the same seed, so the same starting noise), then all meet at
a gate before the denoise, denoise together (diffusers' context-parallel hooks divide the sequence; every rank
ends with the whole latents), and leave: rank 0 decodes and writes, the others end with ``RankDone``.

What keeps a split job from blocking forever:
- the gate is a verdict in the job's TCP store, set once (compare-and-set): "go" when every rank has arrived,
  else the first rank to fail or be cancelled before the denoise stops them all at once;
- inside the denoise the ranks agree on cancelling at every step boundary (an all-reduce of the flag), so they
  all stop after the same step;
- every collective has a timeout (COLLECTIVE_TIMEOUT_S): a rank that dies inside the denoise ends the others'
  wait then (over gloo at once, as its sockets close).
Afterwards the transformers' hooks are removed and the process group destroyed: the next one-GPU job finds the
engine as if it had never been split.
"""
from __future__ import annotations

import hashlib
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable

from engine.planning.split import NO_COLLECTIVES, Split
from engine.settings.values import InputError

# How long the ranks wait for each other to join the job's process group; the pool sends them the job together.
JOIN_TIMEOUT_S = 120.0
# How long a rank waits at the gate for the others to finish loading and encoding: a first run may download the
# model or read a 14B transformer from a slow disk (minutes). A rank that fails or is cancelled before the gate
# ends the wait at once; only a rank whose process dies silently lets it run out (the pool cancels the others then).
GATE_TIMEOUT_S = 3600.0
# How long one collective may wait inside the denoise: the ranks run in step, so this only needs to exceed the
# skew within one step (rank 0 also makes previews); a rank that dies mid-denoise ends the others' wait then.
COLLECTIVE_TIMEOUT_S = 300.0
GATE_POLL_S = 0.05
GO = "go"


@dataclass(frozen=True)
class RankGroup:
    """This engine's part in a split job: its ``rank`` of ``size``, the TCP rendezvous ``address``
    ("127.0.0.1:PORT", a free port the pool chose for this job) and a ``job_key`` unique to the job."""
    rank: int
    size: int
    address: str
    job_key: str

    def __post_init__(self):
        if self.size < 2 or not 0 <= self.rank < self.size:
            raise ValueError(f"a split job needs 2 or more ranks and a rank below them, got rank {self.rank} "
                             f"of {self.size}")
        host, _, port = self.address.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"the rendezvous address must read HOST:PORT, got {self.address!r}")

    @property
    def lead(self) -> bool:
        """Rank 0 decodes, writes the output and reports the job's outcome."""
        return self.rank == 0

    def shared_seed(self) -> int:
        """The seed every rank uses when the request leaves it random: drawn from the job's key, so all ranks agree
        without asking each other (and the key is unique per job, so each job gets its own)."""
        return int.from_bytes(hashlib.sha256(self.job_key.encode()).digest()[:4], "big")

    @property
    def host_port(self) -> tuple[str, int]:
        host, _, port = self.address.rpartition(":")
        return host, int(port)


class PeerStopped(RuntimeError):
    """Another rank of the split job failed before the denoise, so this one stopped too."""


def collective_backend(device: str) -> str:
    """The backend of a split job's process group on ``device``: NCCL on CUDA and ROCm (RCCL answers to the same
    name), gloo on the CPU; refused on other devices and where this PyTorch has neither."""
    from engine.device.hardware import collectives_here

    if device not in ("cuda", "cpu"):
        raise InputError(f"a job cannot be split across {device} devices (no collective backend there): run it "
                         "on one")
    backend = collectives_here(device)
    if not backend:
        raise InputError(NO_COLLECTIVES)
    return backend


class SplitSession:
    """One rank's membership of a split job: the process group and its store, from ``open`` to ``close``."""

    def __init__(self, group: RankGroup, device: str):
        self.group = group
        self.device = device
        self.store = None
        self.opened_seconds = 0.0   # what joining the group cost
        self.backend = ""           # the collective backend it joined over
        self._agreed_cancel = False

    def open(self) -> None:
        """Join the job's process group (rank 0 serves its store)."""
        import torch
        import torch.distributed as dist

        backend = self.backend = collective_backend(self.device)   # refused before waiting for anyone without
        start = time.perf_counter()
        if dist.is_initialized():   # a group a failed job could not close
            dist.destroy_process_group()
        host, port = self.group.host_port
        self.store = dist.TCPStore(host, port, self.group.size, is_master=self.group.lead,
                                   timeout=timedelta(seconds=JOIN_TIMEOUT_S), wait_for_workers=True)
        options = {}
        if self.device == "cuda":
            # The app makes each engine's own GPU its device 0; without this, diffusers' and torch's device
            # meshes would pick device ``rank`` of the visible ones, another engine's GPU.
            torch.cuda.set_device(0)
            if backend == "nccl":
                options["device_id"] = torch.device("cuda", 0)
        dist.init_process_group(backend, store=dist.PrefixStore(self.group.job_key, self.store),
                                rank=self.group.rank, world_size=self.group.size,
                                timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S), **options)
        self.opened_seconds = time.perf_counter() - start

    def stop(self, why: str) -> None:
        """Tell the other ranks to stop before the denoise (nothing when the verdict is already given)."""
        if self.store is None:
            return
        try:
            self.store.compare_set(self._key("verdict"), "", why)
        except Exception:   # the store's server (rank 0) is gone: the others learn it from their own store
            pass

    def gate(self, should_cancel: Callable[[], bool]) -> None:
        """Wait until every rank is ready to denoise (the first verdict set wins, so all ranks obey the same one).
        Raises GateCancelled when a rank, this one or another, was cancelled first; PeerStopped, saying which
        and why, when another failed first. Once this rank is at the gate its own cancel counts only while no
        verdict is given; after "go" it takes effect at the first step boundary."""
        import torch.distributed as dist

        try:
            verdict = self._wait_at_gate(should_cancel)
        except dist.DistError as exc:   # the store's server went away
            if self.group.lead:
                raise
            # Rank 0 serves the store and leaves with it: it stopped before the gate, its verdict gone with it.
            raise PeerStopped("GPU rank 0 of this split job stopped before the denoising (it closed the job's "
                              "meeting point), so this one stopped too") from exc
        if verdict == GO:
            return
        kind, rank, *why = verdict.split(":", 2)
        if kind == "cancel":
            raise GateCancelled(int(rank))
        raise PeerStopped(f"GPU rank {rank} of this split job stopped before the denoising"
                          + (f" ({why[0]})" if why else "") + ", so this one stopped too")

    def _wait_at_gate(self, should_cancel: Callable[[], bool]) -> str:
        """The gate's verdict, once one is given (by this rank or another)."""
        self.store.add(self._key("ready"), 1)
        deadline = time.monotonic() + GATE_TIMEOUT_S
        verdict = ""
        while not verdict:
            if self.store.check([self._key("verdict")]):
                verdict = self.store.get(self._key("verdict")).decode()
            elif self.store.add(self._key("ready"), 0) == self.group.size:
                verdict = self._decide(GO)
            elif should_cancel():
                verdict = self._decide(f"cancel:{self.group.rank}")
            elif time.monotonic() > deadline:
                verdict = self._decide(f"fail:{self.group.rank}:not every GPU of the split job was ready to denoise "
                                       f"within {GATE_TIMEOUT_S:.0f} s")
            else:
                time.sleep(GATE_POLL_S)
        return verdict

    def _decide(self, verdict: str) -> str:
        """The verdict: ``verdict`` when no rank gave one first, else the one given."""
        return self.store.compare_set(self._key("verdict"), "", verdict).decode()

    def agree(self, cancel: bool) -> bool:
        """Whether any rank wants to stop at this step boundary (every rank calls this at every boundary)."""
        import torch
        import torch.distributed as dist

        if not self._agreed_cancel:
            flag = torch.tensor([1.0 if cancel else 0.0], device=self.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            self._agreed_cancel = bool(flag.item())
        return self._agreed_cancel

    @contextmanager
    def parallel(self, models: list, split: Split):
        """``models`` (the pipeline's transformers) run context parallel as ``split`` says while this block
        runs; their hooks are removed afterwards, whatever happened."""
        applied = []
        try:
            for model in models:
                enable_context_parallel(model, split)
                applied.append(model)
            yield
        finally:
            for model in applied:
                disable_context_parallel(model)

    def close(self) -> None:
        """Leave the process group (a local act: no other rank needs to answer)."""
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
        self.store = None

    def _key(self, name: str) -> str:
        return f"{self.group.job_key}/{name}"


class GateCancelled(Exception):
    """A rank was cancelled before the denoise; every rank stops (``rank`` is the one that was)."""

    def __init__(self, rank: int):
        super().__init__(f"cancelled on GPU rank {rank}")
        self.rank = rank


def enable_context_parallel(model, split: Split) -> None:
    """diffusers' context parallel on ``model`` over the current process group: Ulysses or Ring over every rank.

    On a machine without an accelerator diffusers cannot set up the mesh (it picks the device ``rank % device
    count``, a division by zero when the count is 0), so there the model's config is resolved here as diffusers
    would, with the CPU as the device; the stand-in is removed at once. Nothing else differs from the GPU path."""
    import torch
    import torch.distributed as dist
    from diffusers import ContextParallelConfig

    degree = {"ulysses_degree": split.ranks} if split.kind == "ulysses" else {"ring_degree": split.ranks}
    config = ContextParallelConfig(**degree)
    if torch.accelerator.device_count() > 0:
        model.enable_parallelism(config=config)
        return
    from diffusers.models._modeling_parallel import ParallelConfig
    from torch.distributed.device_mesh import init_device_mesh

    def resolve(config):
        config = ParallelConfig(context_parallel_config=config)
        cp = config.context_parallel_config
        mesh = init_device_mesh("cpu", mesh_shape=cp.mesh_shape, mesh_dim_names=cp.mesh_dim_names)
        config.setup(dist.get_rank(), dist.get_world_size(), torch.device("cpu"), mesh=mesh)
        model._parallel_config = config
        return config

    model._resolve_parallel_config = resolve
    try:
        model.enable_parallelism(config=config)
    finally:
        del model._resolve_parallel_config


def disable_context_parallel(model) -> None:
    """Undo ``enable_context_parallel``: the split and gather hooks removed, no config left on the model or its
    attention processors (diffusers has no call for this; these are the three things enabling set)."""
    from diffusers.hooks.context_parallel import remove_context_parallel

    if getattr(model, "_parallel_config", None) is None:
        return
    remove_context_parallel(model, model._cp_plan)
    for module in model.modules():
        processor = getattr(module, "processor", None)
        if processor is not None and getattr(processor, "_parallel_config", None) is not None:
            processor._parallel_config = None
    model._parallel_config = None
