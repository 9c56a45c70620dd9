"""Every GPU in the box: one engine process per GPU, and jobs split across several of them.

The app drives an EnginePool the way it drove one engine: the JobQueue gives each job the engines it runs on
(``slots``, engine numbers here), and the pool runs it there. Each engine process sees the GPUs in its own
order (CUDA_VISIBLE_DEVICES, which ROCm reads too): its own GPU is its device 0, so the engine's code stays
the one-GPU code, and the others stay visible for a split job's collectives. A job on several engines runs the
same request on each, as the ranks of one context-parallel group (engine/run/parallel.py): the first engine
leads, streams the job's events and writes the video; the others only denoise.

Engines are independent processes: one that crashes or hangs is replaced by its own client (worker.py) while
the others keep serving. On a machine without GPUs ``--gpus N`` starts N engine processes sharing the CPU
(each with its share of the cores): the tests use that, over gloo.
"""
from __future__ import annotations

import os
import socket
import sys
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

from engine.events import Event, Info, JobFailed, is_terminal
from engine.errors import ModelError
from engine.run.faults import NO_FAULTS, PhaseHook
from engine.service.worker import WorkerClient, checked
from engine.settings.request import GenerationRequest
from engine.settings.values import InputError

# The environment variable an engine process reads for the machine's numbers of the GPUs it sees, in its order.
GPU_ORDER_ENV = "WAN_GPU_ORDER"
# How long the leader's end waits for the words of the rank whose failure stopped it.
PEER_WORDS_S = 10.0
# How long a job asked for before the first engine has said what GPUs there are waits for that answer.
STARTUP_WAIT_S = 120.0
# After the leading engine of a split job has ended, how long the others get to end too before they are stopped.
RANKS_GRACE_S = 30.0

# What the pool does when the GPUs --gpus names cannot be used: it serves on, with the one engine it has.
ONE_ENGINE_FALLBACK = "running one engine, on the first GPU"


class GpuChoiceError(ValueError):
    """``--gpus`` is malformed; the message says what to write."""


@dataclass(frozen=True)
class GpuChoice:
    """Which GPUs the app uses (``--gpus``): all of them, the first ``count``, or these ``indices``."""
    count: int | None = None                 # None with no indices: all
    indices: tuple[int, ...] | None = None

    @classmethod
    def parse(cls, text: str | None) -> "GpuChoice":
        """"all" (or nothing), "N" (the first N), or a comma list such as "0,1" ("1," is GPU 1 alone)."""
        words = (text or "all").strip().lower()
        hint = "write all, a number of GPUs such as 2, or GPU numbers with commas such as 0,1 (one GPU: 1,)"
        if words == "all":
            return cls()
        if "," in words:
            parts = [part.strip() for part in words.split(",") if part.strip()]
            if not parts or not all(part.isdigit() for part in parts):
                raise GpuChoiceError(f"--gpus {text!r} is not a list of GPU numbers: {hint}")
            indices = tuple(int(part) for part in parts)
            if len(set(indices)) != len(indices):
                raise GpuChoiceError(f"--gpus {text!r} names a GPU twice: {hint}")
            return cls(indices=indices)
        if not words.isdigit() or int(words) < 1:
            raise GpuChoiceError(f"--gpus {text!r} is not understood: {hint}")
        return cls(count=int(words))

    @property
    def known(self) -> int | None:
        """How many engines, when the choice says so without asking the machine."""
        return len(self.indices) if self.indices is not None else self.count

    def pick(self, available: int, cpu_only: bool) -> tuple[int, ...]:
        """The GPU numbers to run engines on, given the machine's ``available`` GPUs (on a CPU-only machine: as
        many CPU engines as asked, "all" being one); GpuChoiceError for a GPU the machine does not have."""
        if cpu_only:
            return tuple(range(self.known or 1))
        if self.indices is not None:
            missing = [index for index in self.indices if index >= available]
            if missing:
                raise GpuChoiceError(f"--gpus names GPU {', '.join(map(str, missing))}, but this machine has "
                                     f"{available} (numbered 0 to {available - 1})")
            return self.indices
        if self.count is not None and self.count > available:
            raise GpuChoiceError(f"--gpus {self.count}: this machine has {available} GPU"
                                 f"{'s' if available != 1 else ''}")
        return tuple(range(self.count or available))


def engine_environment(own: int, gpus: Sequence[int], engines: int, cpu_count: int,
                       inherited: dict[str, str] | None = None) -> dict[str, str]:
    """The variables an engine process on GPU ``own`` starts with: the picked ``gpus`` in its order (its own
    first; numbers within a CUDA_VISIBLE_DEVICES the user set already), and with several engines a share of
    the CPU threads each (unless the user set OMP_NUM_THREADS)."""
    inherited = dict(os.environ if inherited is None else inherited)
    order = [own] + [gpu for gpu in gpus if gpu != own]
    visible = [part.strip() for part in inherited.get("CUDA_VISIBLE_DEVICES", "").split(",") if part.strip()]
    names = [visible[gpu] if gpu < len(visible) else str(gpu) for gpu in order]
    env = {"CUDA_VISIBLE_DEVICES": ",".join(names), GPU_ORDER_ENV: ",".join(map(str, order))}
    if engines > 1 and "OMP_NUM_THREADS" not in inherited:
        env["OMP_NUM_THREADS"] = str(max(1, cpu_count // engines))
    return env


def free_port() -> int:
    """A TCP port on this machine that nothing listens on now (a split job's rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class EnginePool:
    """The engine processes of the app, one per picked GPU; the JobQueue says which runs each job."""

    def __init__(self, models_dir: Path | str = "models", gpus: GpuChoice = GpuChoice(),
                 latents_hours: float | None = None, preview_seconds: float | None = None,
                 faults: PhaseHook = NO_FAULTS, on_resize: Callable[[int], None] | None = None,
                 outputs_dir: Path | str | None = None, ranks_grace_s: float = RANKS_GRACE_S):
        """``on_resize(n)``: told how many engines there are once the machine's GPUs are known (the queue runs
        that many jobs at once). ``faults`` go to the first engine process only (tests). ``outputs_dir``: the
        app's outputs folder (the engines find this machine's measured rates there). ``ranks_grace_s``: how long
        the other ranks of a split job get to end after its leader has (tests shorten it rather than wait)."""
        self.models_dir = str(models_dir)
        self.ranks_grace_s = ranks_grace_s
        self.choice = gpus
        self._options = {"latents_hours": latents_hours, "preview_seconds": preview_seconds,
                         "outputs_dir": outputs_dir}
        self._on_resize = on_resize
        self._lock = threading.Lock()
        first = gpus.indices[0] if gpus.indices else 0
        known = gpus.known
        env = engine_environment(first, gpus.indices or range(known or 1), known or 1, os.cpu_count() or 1) \
            if gpus.indices or (known or 1) > 1 else None
        self.engines: list[WorkerClient] = [self._client(env, faults)]
        self.gpus: tuple[int, ...] = (first,)
        self._grown = threading.Event()
        self._growing: threading.Thread | None = None
        self.problem: str | None = None     # why the engines are fewer than --gpus asked for (then: one engine)

    def _client(self, env: dict | None, faults: PhaseHook = NO_FAULTS) -> WorkerClient:
        return WorkerClient(self.models_dir, faults=faults, env=env, **self._options)

    # ----- the engines -----------------------------------------------------
    @property
    def catalog(self):
        return self.engines[0].catalog

    def start(self, every: bool = True) -> None:
        """Start the first engine now, and once it has said what GPUs there are (in the background), make one
        engine per picked GPU (``on_resize`` is told how many) and start them too (``every``; otherwise each
        starts with its first job: a command-line run starts only the engines its job uses)."""
        self.engines[0].start()
        with self._lock:
            if self._growing is None:
                self._growing = threading.Thread(target=self._grow, args=(every,), name="engine-pool-start",
                                                 daemon=True)
                self._growing.start()

    def wait_started(self, timeout: float | None = None) -> int:
        """Wait until every engine has been created (not necessarily ready); how many there are."""
        self._grown.wait(timeout)
        return len(self.engines)

    def _grow(self, every: bool) -> None:
        try:
            profile = self.engines[0].hardware_profile()
            gpus = self.choice.pick(profile.gpu_count, profile.gpu_count == 0)
        except (OSError, GpuChoiceError) as exc:
            self.problem = str(exc)
            print(f"[engines] error: {self.problem}; {ONE_ENGINE_FALLBACK}", file=sys.stderr, flush=True)
            self._grown.set()
            return
        with self._lock:
            for own in gpus[len(self.engines):]:
                client = self._client(engine_environment(own, gpus, len(gpus), profile.cpu_count))
                self.engines.append(client)
                if every:
                    client.start()
            self.gpus = tuple(gpus)
        if self._on_resize:
            self._on_resize(len(self.engines))
        self._grown.set()

    @property
    def started(self) -> bool:
        """The first engine has said what GPUs there are, and the engines are made (``start`` was called)."""
        return self._grown.is_set()

    def engine_count(self, timeout: float = 10.0) -> int:
        """How many engines there are, once the first has said what GPUs there are (within ``timeout``)."""
        if self._growing is not None:
            self._grown.wait(timeout)
        return len(self.engines)

    def close(self) -> None:
        for engine in self.engines:
            engine.close()

    def hardware_profile(self):
        """The machine as the first engine process sees it (every GPU listed, its own first)."""
        return self.engines[0].hardware_profile()

    def memory(self, timeout: float = 5.0, slot: int = 0):
        return self.engines[slot].memory(timeout=timeout)

    def memories(self, timeout: float = 2.0) -> list:
        """What each engine process holds now, in engine order (see WorkerClient.memory)."""
        return [engine.memory(timeout=timeout) for engine in list(self.engines)]

    def all_loaded_files(self, timeout: float = 2.0) -> list:
        """The files each engine's loaded pipeline holds, in engine order (see WorkerClient.loaded_files)."""
        return [engine.loaded_files(timeout=timeout) for engine in list(self.engines)]

    def all_running_settings(self) -> list:
        """The settings of every job running now (the models they use may not be deleted meanwhile)."""
        return [engine.running_settings for engine in list(self.engines) if engine.running_settings is not None]

    # ----- jobs --------------------------------------------------------------
    def check(self, request: GenerationRequest):
        return self.engines[0].check(request)

    def new_job_id(self) -> str:
        return self.engines[0].new_job_id()

    def engines_for(self, request: GenerationRequest) -> int:
        """How many engines ``request`` runs on: the ``gpus`` it asks for, or the planner's automatic choice (one
        unless the model fits on the device only split: planner.gpus_for), never more than there are."""
        from engine.planning.planner import gpus_for

        have = self.engine_count(timeout=STARTUP_WAIT_S)
        asked = request.settings.gpus
        if have < 2 or asked == 1:
            return 1
        if asked >= 2:
            return min(asked, have)
        try:
            wanted, _ = gpus_for(request.settings, self.catalog.info(request.settings).spec,
                                 self.hardware_profile(), have)
        except (InputError, ModelError, OSError):
            return 1
        return max(1, min(wanted, have))

    def unload(self) -> None:
        for engine in list(self.engines):
            engine.unload()

    def cancel(self, slots: Sequence[int] | None = None) -> None:
        """Ask the jobs on ``slots`` (all engines: None) to stop at their next step."""
        for slot in range(len(self.engines)) if slots is None else slots:
            self.engines[slot].cancel()

    def submit(self, request: GenerationRequest, job_id: str | None = None, notes: Sequence[str] = ()) -> Iterator[Event]:
        """``check`` then ``run`` on the engines it needs (``engines_for``), the checks' notes followed by ``notes``;
        bad input ends in a JobFailed event, before any engine works."""
        job_id = job_id or self.new_job_id()
        yield from checked(self.check, request, job_id, lambda checked_request, said: self.run(
            checked_request, [*said, *notes], job_id, tuple(range(self.engines_for(checked_request)))))

    def decode(self, latents: str, tiled: bool = False, on_cpu: bool = False, job_id: str | None = None,
               slots: Sequence[int] = (0,)) -> Iterator[Event]:
        yield from self.engines[slots[0] if slots else 0].decode(latents, tiled, on_cpu, job_id)

    def post(self, path: str, step: str, factor: int, job_id: str | None = None,
             slots: Sequence[int] = (0,)) -> Iterator[Event]:
        yield from self.engines[slots[0] if slots else 0].post(path, step, factor, job_id)

    def run(self, request: GenerationRequest, notes: list[str] | tuple = (), job_id: str | None = None,
            slots: Sequence[int] = (0,)) -> Iterator[Event]:
        """Run a checked request on the engines ``slots`` (the queue's pick): one engine runs it alone; several
        run it as one context-parallel group led by the first."""
        slots = tuple(slots) or (0,)
        if len(slots) == 1:
            yield from self.engines[slots[0]].run(request, notes, job_id)
            return
        yield from self._run_split(request, notes, job_id or self.new_job_id(), slots)

    def _run_split(self, request: GenerationRequest, notes, job_id: str, slots: tuple[int, ...]) -> Iterator[Event]:
        from engine.run.parallel import RankGroup

        address, key = f"127.0.0.1:{free_port()}", uuid.uuid4().hex[:8]
        groups = [RankGroup(rank, len(slots), address, key) for rank in range(len(slots))]
        told = False     # the failed rank's words were shown
        failures: list[tuple[int, JobFailed]] = []
        followers = []
        for rank, slot in list(enumerate(slots))[1:]:
            events = self.engines[slot].run(request, (), f"{job_id}-rank{rank}", group=groups[rank])
            thread = threading.Thread(target=self._follow, args=(rank, slot, events, failures, slots),
                                      name=f"rank-{rank}", daemon=True)
            thread.start()
            followers.append((slot, thread))
        yield Info(job_id, f"Split across {len(slots)} GPUs (engines {', '.join(map(str, slots))}): the first "
                           "leads and writes the video.")
        lead = self.engines[slots[0]].run(request, notes, job_id, group=groups[0])
        try:
            for event in lead:
                if isinstance(event, JobFailed) and event.kind == "peer":
                    for _, thread in followers:   # the failed rank's own words, before the job's end
                        thread.join(PEER_WORDS_S)
                if failures and not told:
                    told = True
                    rank, failure = failures[0]
                    yield Info(job_id, f"The engine of rank {rank} failed ({failure.text}); the job is stopped on "
                                       "every GPU.")
                    self.cancel(slots)
                yield event
                if is_terminal(event):
                    break
        finally:
            lead.close()
            self.cancel(slots[1:])
            for slot, thread in followers:
                thread.join(self.ranks_grace_s)
                if thread.is_alive():   # stuck in a collective its leader left: stopped, and started afresh
                    self.engines[slot].kill()
                    thread.join(self.ranks_grace_s)

    def _follow(self, rank: int, slot: int, events: Iterator[Event], failures: list, slots: tuple[int, ...]) -> None:
        """Drain a following rank's events (its engine says nothing the user needs); a failure stops the group:
        the others are asked to cancel, and the leader, which may wait in a collective for the failed rank, is
        stopped if it does not end by itself."""
        for event in events:
            # "peer": it stopped because another rank failed, and that one says why.
            if isinstance(event, JobFailed) and event.kind != "peer":
                failures.append((rank, event))
                self.cancel(slots)
                timer = threading.Timer(self.ranks_grace_s, self._stop_if_running, args=(slots[0],))
                timer.daemon = True
                timer.start()
            if is_terminal(event):
                break

    def _stop_if_running(self, slot: int) -> None:
        if self.engines[slot].busy:
            self.engines[slot].kill()
