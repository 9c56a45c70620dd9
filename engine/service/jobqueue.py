"""The queue in front of the engines: first come first served, one job per engine at a time.

A machine with several GPUs runs one engine per GPU (engine/service/pool.py): the job at the head of the queue
goes to a free engine as soon as there is one (a job split across several GPUs waits for that many), and a
free engine that already holds the job's model is preferred, so it need not load it again. A waiting job
knows its place and an estimate of its wait, and its owner can take it out; a job of several videos (the settings'
``count``) counts as that many in the estimate: the running one says what is left of all of them, and the recent jobs'
lengths are kept per video; each running job says what it is
doing, for every visitor's system panel. The page and the API put every engine job through one JobQueue
(ui/generate.py); the engine processes never see a waiting job. Threads only: no gradio, no torch.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

from engine.events import Ending, JobEnding

# A running job past its own estimate is taken to need this share of the time it has run so far again (at
# least SOON_S): a queue never says "0 s" while a job runs ahead.
OVERRUN_SHARE = 0.25
SOON_S = 1.0
# How many finished jobs' durations (each per video it made) the estimate averages.
RECENT_JOBS = 5
# A cancel this soon after the owner's job ended is answered "it had already finished".
RECENTLY_ENDED_S = 30.0
# The fewest places one login may hold in the queue, whatever its size (serve --queue-share).
SMALLEST_SHARE = 2


def default_share(max_waiting: int) -> int:
    """The places one login may hold in a queue of ``max_waiting``: half, at least SMALLEST_SHARE (never more than
    the queue): the other half stays open to the other logins."""
    return min(max_waiting, max(SMALLEST_SHARE, max_waiting // 2))


class QueueFull(Exception):
    """No more jobs may wait (or none more of this login's); the message says so and what to do."""


@dataclass(eq=False)
class Ticket:
    """One job's place in the queue, from joining it to leaving it."""
    owner: str | None        # the page session (or API client) that asked for it
    what: str                # "text to video", "decode again", ...
    joined: float
    login: str | None = None          # the login it came with, whose share of the queue it takes (None: no share)
    engines: int = 1         # how many engines it runs on at once (a job split across GPUs: more than one)
    model: str | None = None          # the model it runs, to prefer an engine that holds it already
    slots: tuple[int, ...] = ()       # the engines it was given when its turn came (the first leads)
    started: float | None = None      # when its turn came
    withdrawn: bool = False           # its owner took it out before it ran
    doing: str = ""                   # what it does now, once it runs (for every visitor: no user text)
    left: tuple[float, float] | None = None   # (seconds left of all its videos, when that was said) while it runs
    videos: int = 1                   # how many videos it makes (the settings' count), one after the other
    video: int = 1                    # the one it makes now, once it runs


@dataclass(frozen=True)
class _Ended:
    """How the last job that ran ended (no prompt, no message text: any visitor may be shown it), whose it
    was and when."""
    ending: JobEnding
    owner: str | None
    at: float


class JobQueue:
    def __init__(self, max_waiting: int = 16, clock: Callable[[], float] = time.monotonic, engines: int = 1,
                 share: int | None = None):
        """``engines``: how many jobs may run at once (one per engine process; ``resize`` changes it once the
        machine's GPUs are known). ``share``: how many of the ``max_waiting`` places one login's jobs may hold at
        once (default: ``default_share``), so one login never fills the queue for the others."""
        self.max_waiting = max_waiting
        self.share = default_share(max_waiting) if share is None else max(1, min(share, max_waiting))
        self._clock = clock
        self._changed = threading.Condition()
        self._waiting: list[Ticket] = []
        self._running: list[Ticket] = []
        self._engines = max(1, engines)
        self._held: dict[int, str | None] = {}    # engine -> the model its last job ran
        self._durations: deque[float] = deque(maxlen=RECENT_JOBS)
        self._last: _Ended | None = None

    @property
    def engines(self) -> int:
        with self._changed:
            return self._engines

    def resize(self, engines: int) -> None:
        """Run up to ``engines`` jobs at once from now on (the running ones are not touched)."""
        with self._changed:
            self._engines = max(1, engines)
            self._changed.notify_all()

    # ----- joining, waiting, leaving ---------------------------------------
    def join(self, owner: str | None, what: str, engines: int = 1, model: str | None = None,
             videos: int = 1, login: str | None = None) -> Ticket:
        """A place at the back of the queue for a job that runs on ``engines`` engines at once (more than the
        queue has: all of them), uses ``model`` and makes ``videos`` videos, for ``login``; QueueFull when
        ``max_waiting`` jobs wait already, or ``login``'s jobs hold its share of the places."""
        with self._changed:
            if len(self._waiting) >= self.max_waiting:
                raise QueueFull(f"The queue is full: {len(self._waiting)} jobs are waiting for the engine. "
                                "Try again when one of them has finished.")
            held = 0 if login is None else sum(ticket.login == login for ticket in self._waiting)
            if held >= self.share:
                raise QueueFull(f"The queue is full for your login: {held} of your jobs are waiting, the most one "
                                f"login may have waiting ({self.share} of the queue's {self.max_waiting} places; the "
                                "rest stay open to other logins). Generate again when one of yours has started, or "
                                "cancel one.")
            ticket = Ticket(owner, what, self._clock(), login, max(1, engines), model, videos=max(1, videos))
            self._waiting.append(ticket)
            self._changed.notify_all()
            return ticket

    def _free(self) -> list[int]:
        busy = {slot for ticket in self._running for slot in ticket.slots}
        return [slot for slot in range(self._engines) if slot not in busy]

    def _pick(self, ticket: Ticket, free: list[int]) -> tuple[int, ...]:
        """The engines for ``ticket`` among the free ones: those holding its model first, then those that have
        run nothing yet, then the rest, each group in engine order."""
        def rank(slot: int) -> int:
            if ticket.model is not None and self._held.get(slot) == ticket.model:
                return 0
            return 1 if slot not in self._held else 2
        return tuple(sorted(free, key=lambda slot: (rank(slot), slot))[:min(ticket.engines, self._engines)])

    def wait_turn(self, ticket: Ticket, timeout: float) -> bool:
        """True once it is ``ticket``'s turn (it runs from then on, on ``ticket.slots``); False after
        ``timeout`` seconds without it, or at once when it was taken out of the queue. Strictly in order: the
        job at the head waits for as many engines as it needs, and the ones behind it wait for it."""
        with self._changed:
            def my_turn() -> bool:
                return ticket.withdrawn or ticket in self._running or (
                    bool(self._waiting) and self._waiting[0] is ticket and
                    len(self._free()) >= min(ticket.engines, self._engines))

            self._changed.wait_for(my_turn, timeout)
            if ticket.withdrawn or not my_turn():
                return False
            if ticket not in self._running:
                self._waiting.pop(0)
                ticket.slots = self._pick(ticket, self._free())
                for slot in ticket.slots:
                    self._held[slot] = ticket.model
                self._running.append(ticket)
                ticket.started = self._clock()
                ticket.doing = f"starting {ticket.what}"
                self._changed.notify_all()
            return True

    def leave(self, ticket: Ticket, ending: JobEnding | None = None) -> None:
        """``ticket`` is done: finished, failed, cancelled or never run; ``ending`` says how one that ran ended
        (None: it stopped without saying how)."""
        with self._changed:
            if ticket in self._running:
                now = self._clock()
                self._running.remove(ticket)
                if ticket.started is not None:   # per video it reached (the last perhaps cut short)
                    self._durations.append((now - ticket.started) / max(1, min(ticket.video, ticket.videos)))
                self._last = _Ended(ending or JobEnding(Ending.STOPPED), ticket.owner, now)
            elif ticket in self._waiting:
                self._waiting.remove(ticket)
            self._changed.notify_all()

    def forget(self, slot: int) -> None:
        """Engine ``slot`` holds no model any more (it was restarted or unloaded)."""
        with self._changed:
            self._held[slot] = None

    def withdraw(self, owner: str | None) -> int:
        """Take ``owner``'s waiting jobs out of the queue (the running one is not touched); how many."""
        if owner is None:
            return 0
        with self._changed:
            mine = [t for t in self._waiting if t.owner == owner]
            for ticket in mine:
                ticket.withdrawn = True
                self._waiting.remove(ticket)
            self._changed.notify_all()
            return len(mine)

    def withdraw_ticket(self, ticket: Ticket) -> bool:
        """Take ``ticket`` out of the queue if it still waits (the JSON API's DELETE of one job); whether it did."""
        with self._changed:
            if ticket not in self._waiting:
                return False
            ticket.withdrawn = True
            self._waiting.remove(ticket)
            self._changed.notify_all()
            return True

    @contextmanager
    def turn(self, owner: str | None, what: str, engines: int = 1) -> Iterator[Ticket]:
        """Wait for a turn on ``engines`` engines without showing the wait (short engine work, such as unloading
        the models)."""
        ticket = self.join(owner, what, engines)
        try:
            while not self.wait_turn(ticket, 1.0):
                if ticket.withdrawn:
                    raise QueueFull(f"{what} was taken out of the queue")
            yield ticket
        finally:
            self.leave(ticket, JobEnding(Ending.DONE, what=what))

    # ----- what the running job says -----------------------------------------
    def report(self, ticket: Ticket, doing: str, seconds_left: float | None = None, video: int | None = None) -> None:
        """What the running ``ticket`` is doing now, how long it expects to take still (all its videos), and which of
        its videos it makes now."""
        with self._changed:
            ticket.doing = doing
            if seconds_left is not None:
                ticket.left = (seconds_left, self._clock())
            if video is not None:
                ticket.video = video

    # ----- what the page shows ----------------------------------------------------
    def place(self, ticket: Ticket) -> int:
        """Jobs ahead of ``ticket`` (the running ones included); 0 once it runs or has left."""
        with self._changed:
            if ticket not in self._waiting:
                return 0
            return self._waiting.index(ticket) + len(self._running)

    def estimate(self, ticket: Ticket) -> float | None:
        """Seconds until ``ticket``'s turn, from the running jobs' own estimates and recent jobs' durations;
        None when nothing has finished yet to estimate from.

        Each engine is free at some time from now (a running job's time left, all its videos; now for an idle one);
        the jobs ahead take the engines that free up first, in order, each for a typical video's length times its
        videos."""
        with self._changed:
            if ticket not in self._waiting:
                return 0.0
            typical = sum(self._durations) / len(self._durations) if self._durations else None
            now = self._clock()
            free_at = {slot: 0.0 for slot in range(self._engines)}
            for running in self._running:
                if running.left is not None:
                    left, said = running.left
                    ends = left - (now - said)
                elif typical is not None and running.started is not None:
                    ends = typical * running.videos - (now - running.started)
                else:
                    return None
                if running.started is not None and ends <= 0:   # past its estimate and still running: not done yet
                    ends = max(OVERRUN_SHARE * (now - running.started), SOON_S)
                ends = max(ends, SOON_S)
                for slot in running.slots:
                    free_at[slot] = ends
            for ahead in self._waiting[:self._waiting.index(ticket)]:
                if typical is None:
                    return None
                taken = sorted(free_at, key=free_at.get)[:min(ahead.engines, self._engines)]
                starts = max(free_at[slot] for slot in taken)
                for slot in taken:
                    free_at[slot] = starts + typical * ahead.videos
            return sorted(free_at.values())[min(ticket.engines, self._engines) - 1]

    @property
    def running(self) -> Ticket | None:
        """The job that started first of those running now (None: none runs)."""
        with self._changed:
            return self._running[0] if self._running else None

    @property
    def running_jobs(self) -> list[Ticket]:
        """Every job running now, in the order they started."""
        with self._changed:
            return list(self._running)

    @property
    def waiting(self) -> int:
        with self._changed:
            return len(self._waiting)

    def runs_for(self, owner: str | None) -> bool:
        """A running job is ``owner``'s."""
        return bool(self.running_for(owner))

    def running_for(self, owner: str | None) -> list[Ticket]:
        """``owner``'s running jobs."""
        with self._changed:
            return [] if owner is None else [ticket for ticket in self._running if ticket.owner == owner]

    def held_for(self, owner: str | None, joined_before: float = 0.0, what: str | None = None) -> Ticket | None:
        """``owner``'s job (of ``what``, when given) that waits or runs and joined at least ``joined_before``
        seconds ago (None: none)."""
        with self._changed:
            now = self._clock()
            return next((ticket for ticket in [*self._running, *self._waiting] if owner is not None and
                         ticket.owner == owner and now - ticket.joined >= joined_before and
                         what in (None, ticket.what)), None)

    def ended_recently_for(self, owner: str | None, within: float = RECENTLY_ENDED_S) -> bool:
        """The last job that ran was ``owner``'s and ended less than ``within`` seconds ago."""
        with self._changed:
            last = self._last
            return owner is not None and last is not None and last.owner == owner and \
                self._clock() - last.at < within

    def last_ending(self) -> tuple[JobEnding, float] | None:
        """(how the last job that ran ended, seconds since), or None before the first one."""
        with self._changed:
            return None if self._last is None else (self._last.ending, self._clock() - self._last.at)
