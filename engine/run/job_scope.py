"""Where a whole job and one rank's part of a split job differ, behind one small protocol.

A job runs the same steps whether it has the GPU to itself or shares the denoise with other engines (context
parallel, engine/run/parallel.py); what differs is asked of its ``JobScope``: the seed a random request gets,
joining the other ranks, whether to stop at a step boundary, what wraps the denoising call, and whether this
engine leads (writes the outputs and reports the job's outcome). ``WholeJob`` and ``SplitJob`` are the two.
"""
from __future__ import annotations

import secrets
from contextlib import contextmanager, nullcontext
from typing import Callable, ContextManager, Protocol

from engine.device.runtime import peak_vram_gb
from engine.events import Event, RankDone
from engine.planning.planner import Plan
from engine.run.job import Cancelled, Job
from engine.run.parallel import GateCancelled, RankGroup, SplitSession
from engine.settings.values import InputError


class JobScope(Protocol):
    ranks: int          # the engines sharing the denoise (1: a whole job)
    leads: bool         # this engine makes the previews, writes the outputs and reports the outcome
    steps_down: bool    # out of memory may step down the ladder (not alone, while others wait in the denoise)

    def title(self, base: str) -> str:
        """The job's title as JobStarted says it."""

    def running(self, work: Callable[[], Event]) -> Event:
        """``work()``, with whatever the scope must do when it ends (a split job leaves its group)."""

    def join(self, plan: Plan, gpus: int, job: Job) -> None:
        """Meet the other ranks once the plan is known, or refuse a plan that cannot be shared."""

    def seed(self) -> int:
        """The seed of a request that leaves it random."""

    def denoising(self, models: list, plan: Plan, job: Job) -> ContextManager:
        """What the denoising call runs inside (``models``: the pipeline's transformers)."""

    def stops(self, job: Job, last: bool = False) -> bool:
        """Whether the denoise stops at this step boundary (``last``: the one after the last step)."""

    def outcome(self, job: Job, finish: Callable[[], Event]) -> Event:
        """The job's outcome after the denoise: ``finish()`` (decoded and written) where this engine leads."""


class WholeJob:
    """A job on this engine alone."""
    ranks = 1
    leads = True
    steps_down = True

    def title(self, base: str) -> str:
        return base

    def running(self, work: Callable[[], Event]) -> Event:
        return work()

    def join(self, plan: Plan, gpus: int, job: Job) -> None:
        if gpus > 1:
            job.info(f"The settings ask for {gpus} GPUs, but this engine was given the whole job: it runs on one GPU.")

    def seed(self) -> int:
        return secrets.randbelow(2**32)

    def denoising(self, models: list, plan: Plan, job: Job) -> ContextManager:
        return nullcontext()

    def stops(self, job: Job, last: bool = False) -> bool:
        return job.should_cancel()

    def outcome(self, job: Job, finish: Callable[[], Event]) -> Event:
        return finish()


class SplitJob:
    """This engine's part of a job split across GPUs: the ranks agree on the seed, meet at a gate before the
    denoise, denoise context parallel and agree on cancelling at every step; rank 0 leads, the others end with
    RankDone after the denoise."""
    steps_down = False   # a split job's ranks cannot step down alone: the others would wait in the denoise for it

    def __init__(self, group: RankGroup, device: str):
        self.group = group
        self.session = SplitSession(group, device)
        self.ranks = group.size
        self.leads = group.lead

    def title(self, base: str) -> str:
        return f"{base}, part {self.group.rank + 1} of {self.group.size} (split across GPUs)"

    def running(self, work: Callable[[], Event]) -> Event:
        """``work()``, leaving the group whatever happens. A failure or cancel before the denoise tells the other
        ranks at once (they stop too)."""
        try:
            return work()
        except (Cancelled, GateCancelled):
            self.session.stop(f"cancel:{self.group.rank}")
            raise
        except Exception as exc:
            self.session.stop(f"fail:{self.group.rank}:{str(exc)[:200] or type(exc).__name__}")
            raise
        finally:
            self.session.close()

    def join(self, plan: Plan, gpus: int, job: Job) -> None:
        """Refuse a split the plan says cannot work (every rank refuses alike, before any heavy work and before
        waiting for the others), else join the job's process group."""
        if not plan.split.possible:
            raise InputError(f"this job cannot be split across {plan.split.ranks} GPUs: {plan.split.reason}")
        self.session.open()
        job.info(f"GPU rank {self.group.rank} of {self.group.size} joined the split job ({plan.split.kind}, over "
                 f"{self.session.backend}) in {self.session.opened_seconds:.2f} s.")

    def seed(self) -> int:
        return self.group.shared_seed()   # the same on every rank, so each starts from the same noise

    @contextmanager
    def denoising(self, models: list, plan: Plan, job: Job):
        """Every rank at the gate, then the transformers context parallel (Ulysses or Ring, as the plan says)
        while the block runs; their hooks are removed afterwards."""
        self.session.gate(job.should_cancel)
        with self.session.parallel(models, plan.split):
            yield

    def stops(self, job: Job, last: bool = False) -> bool:
        """Every rank asks at every boundary (a collective); after the last step only what was agreed counts."""
        return self.session.agree(False if last else job.should_cancel())

    def outcome(self, job: Job, finish: Callable[[], Event]) -> Event:
        if self.leads:
            return finish()
        return RankDone(job.id, self.group.rank, self.group.size, len(job.step_seconds), dict(job.timings),
                        peak_vram_gb())
