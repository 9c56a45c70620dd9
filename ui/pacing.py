"""A job's engine events, handed to the page in batches no more often than it can take them.

Every page update is rendered twice (the server builds the status, the phase table and the chart; the browser
draws them), so a model whose steps take a fraction of a second, or a machine busy with other work, would make
updates pile up: the page would fall behind the engine, and a Cancel or the final video would appear long after
they happened. Here a thread reads the engine's events as they come; the page gets whatever arrived since its
last update, at most every ``interval`` seconds for routine events (steps, windows, previews, downloads), at
once for the others (a phase, the plan, the end).
"""
from __future__ import annotations

import queue
import threading
import time
from typing import Callable, Iterator

from engine.events import DownloadProgress, Event, PostProgress, PreviewReady, StepFinished, WindowDone, is_terminal

# Events that may wait for the next update; any other event is shown at once (with those before it).
ROUTINE = (StepFinished, WindowDone, PostProgress, PreviewReady, DownloadProgress)
_END = object()


def paced(events: Iterator[Event], interval: float, stop: Callable[[], None],
          clock: Callable[[], float] = time.monotonic) -> Iterator[list[Event]]:
    """Batches of ``events`` in their order, each ending in a non-routine event or sent ``interval`` seconds
    after the previous batch. When the caller stops listening before the terminal event, ``stop()`` is called
    (it should cancel the job) and the events are drained to their end, so the engine is free afterwards."""
    arrived: queue.Queue = queue.Queue()
    failure: list[BaseException] = []

    def read() -> None:
        try:
            for event in events:
                arrived.put(event)
        except BaseException as exc:   # given to the listener, raised where it reads
            failure.append(exc)
        finally:
            arrived.put(_END)

    reader = threading.Thread(target=read, name="job-events", daemon=True)
    reader.start()
    last_sent = clock() - interval
    ended = False
    try:
        while not ended:
            batch = [arrived.get()]
            while True:
                if batch[-1] is _END or not isinstance(batch[-1], ROUTINE):
                    break
                wait = interval - (clock() - last_sent)
                try:
                    batch.append(arrived.get(timeout=wait) if wait > 0 else arrived.get_nowait())
                except queue.Empty:
                    break
            if batch[-1] is _END:
                batch.pop()
                ended = True
            if batch:
                last_sent = clock()
                ended = ended or is_terminal(batch[-1])
                yield batch
        if failure:
            raise failure[0]
    finally:
        if not ended:
            stop()
        reader.join()
