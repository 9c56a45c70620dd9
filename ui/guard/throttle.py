"""Wrong passwords per address: a few free tries, then each next one waits twice as long as the one before.

A try is counted when it starts, not when its answer comes: forty tries sent at once are forty tries, so the
free ones are exactly FREE_LOGIN_TRIES however many run side by side. While an address must wait, every try
from it is refused, the right password too: otherwise the answer to a try during the wait would still tell a
guesser whether it was right. The right password, once let through, clears the address's count.
"""
from __future__ import annotations

import math
import threading
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Callable

# Wrong passwords one address may try freely within the window; each one after that doubles the wait.
FREE_LOGIN_TRIES = 5
LOGIN_WINDOW_S = 15 * 60
LONGEST_LOGIN_WAIT_S = 300.0


@dataclass
class LoginThrottle:
    clock: Callable[[], float] = time.monotonic
    _tries: dict = field(default_factory=lambda: defaultdict(deque))
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self, address: str) -> int:
        """Whole seconds ``address`` must still wait (at least 1), or 0 after counting this try as a wrong one
        until ``succeeded`` says otherwise. One step under one lock: no two tries read the same count."""
        with self._lock:
            tries = self._recent(address)
            if len(tries) >= FREE_LOGIN_TRIES:
                wait = min(LONGEST_LOGIN_WAIT_S, 2.0 ** (len(tries) - FREE_LOGIN_TRIES))
                left = tries[-1] + wait - self.clock()
                if left > 0:
                    return max(1, math.ceil(left))
            tries.append(self.clock())
            return 0

    def succeeded(self, address: str) -> None:
        with self._lock:
            self._tries.pop(address, None)

    def _recent(self, address: str) -> deque:
        tries = self._tries[address]
        while tries and self.clock() - tries[0] > LOGIN_WINDOW_S:
            tries.popleft()
        return tries
