"""The queue in front of the engine: one job runs at a time, first come first served.

A waiting job knows its place and an estimate of its wait, and its owner can take it out; the job
that runs says what it is doing, for every visitor's system panel. The page and the API put every
engine job through one JobQueue (ui/generate.py); the engine process never sees a waiting job.
Threads only: no gradio, no torch.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

from engine.events import Ending, JobEnding

# How many finished jobs' durations the estimate averages.
RECENT_JOBS = 5
# A cancel this soon after the owner's job ended is answered "it had already finished".
RECENTLY_ENDED_S = 30.0


class QueueFull(Exception):
    """No more jobs may wait; the message says so and what to do."""


@dataclass(eq=False)
class Ticket:
    """One job's place in the queue, from joining it to leaving it."""
    owner: str | None        # the page session (or API client) that asked for it
    what: str                # "text to video", "decode again", ...
    joined: float
    started: float | None = None      # when its turn came
    withdrawn: bool = False           # its owner took it out before it ran
    doing: str = ""                   # what it does now, once it runs (for every visitor: no user text)
    left: tuple[float, float] | None = None   # (seconds left, when that was said) while it runs


@dataclass(frozen=True)
class _Ended:
    """How the last job that ran ended (no prompt, no message text: any visitor may be shown it), whose it
    was and when."""
    ending: JobEnding
    owner: str | None
    at: float


class JobQueue:
    def __init__(self, max_waiting: int = 16, clock: Callable[[], float] = time.monotonic):
        self.max_waiting = max_waiting
        self._clock = clock
        self._changed = threading.Condition()
        self._waiting: list[Ticket] = []
        self._running: Ticket | None = None
        self._durations: deque[float] = deque(maxlen=RECENT_JOBS)
        self._last: _Ended | None = None

    # ----- joining, waiting, leaving ---------------------------------------
    def join(self, owner: str | None, what: str) -> Ticket:
        """A place at the back of the queue; QueueFull when ``max_waiting`` jobs wait already."""
        with self._changed:
            if len(self._waiting) >= self.max_waiting:
                raise QueueFull(f"The queue is full: {len(self._waiting)} jobs are waiting for the engine. "
                                "Try again when one of them has finished.")
            ticket = Ticket(owner, what, self._clock())
            self._waiting.append(ticket)
            self._changed.notify_all()
            return ticket

    def wait_turn(self, ticket: Ticket, timeout: float) -> bool:
        """True once it is ``ticket``'s turn (it runs from then on); False after ``timeout`` seconds without
        it, or at once when it was taken out of the queue."""
        with self._changed:
            def my_turn() -> bool:
                return ticket.withdrawn or ticket is self._running or (
                    self._running is None and bool(self._waiting) and self._waiting[0] is ticket)

            self._changed.wait_for(my_turn, timeout)
            if ticket.withdrawn or not my_turn():
                return False
            if ticket is not self._running:
                self._waiting.pop(0)
                self._running = ticket
                ticket.started = self._clock()
                ticket.doing = f"starting {ticket.what}"
                self._changed.notify_all()
            return True

    def leave(self, ticket: Ticket, ending: JobEnding | None = None) -> None:
        """``ticket`` is done: finished, failed, cancelled or never run; ``ending`` says how one that ran ended
        (None: it stopped without saying how)."""
        with self._changed:
            if ticket is self._running:
                now = self._clock()
                self._running = None
                if ticket.started is not None:
                    self._durations.append(now - ticket.started)
                self._last = _Ended(ending or JobEnding(Ending.STOPPED), ticket.owner, now)
            elif ticket in self._waiting:
                self._waiting.remove(ticket)
            self._changed.notify_all()

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

    @contextmanager
    def turn(self, owner: str | None, what: str) -> Iterator[Ticket]:
        """Wait for a turn without showing the wait (short engine work, such as unloading the model)."""
        ticket = self.join(owner, what)
        try:
            while not self.wait_turn(ticket, 1.0):
                if ticket.withdrawn:
                    raise QueueFull(f"{what} was taken out of the queue")
            yield ticket
        finally:
            self.leave(ticket, JobEnding(Ending.DONE, what=what))

    # ----- what the running job says -----------------------------------------
    def report(self, ticket: Ticket, doing: str, seconds_left: float | None = None) -> None:
        """What the running ``ticket`` is doing now, and how long it expects to take still."""
        with self._changed:
            ticket.doing = doing
            if seconds_left is not None:
                ticket.left = (seconds_left, self._clock())

    # ----- what the page shows ----------------------------------------------------
    def place(self, ticket: Ticket) -> int:
        """Jobs ahead of ``ticket`` (the running one included); 0 once it runs or has left."""
        with self._changed:
            if ticket not in self._waiting:
                return 0
            return self._waiting.index(ticket) + (self._running is not None)

    def estimate(self, ticket: Ticket) -> float | None:
        """Seconds until ``ticket``'s turn, from the running job's own estimate and recent jobs' durations;
        None when nothing has finished yet to estimate from."""
        with self._changed:
            if ticket not in self._waiting:
                return 0.0
            typical = sum(self._durations) / len(self._durations) if self._durations else None
            wait = 0.0
            running = self._running
            if running is not None:
                now = self._clock()
                if running.left is not None:
                    left, said = running.left
                    wait += max(0.0, left - (now - said))
                elif typical is not None and running.started is not None:
                    wait += max(0.0, typical - (now - running.started))
                else:
                    return None
            ahead = self._waiting.index(ticket)
            if ahead:
                if typical is None:
                    return None
                wait += ahead * typical
            return wait

    @property
    def running(self) -> Ticket | None:
        with self._changed:
            return self._running

    @property
    def waiting(self) -> int:
        with self._changed:
            return len(self._waiting)

    def runs_for(self, owner: str | None) -> bool:
        """The running job is ``owner``'s."""
        with self._changed:
            return owner is not None and self._running is not None and self._running.owner == owner

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
