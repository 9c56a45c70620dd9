"""Chaining page events."""
from __future__ import annotations


def when_ended(run, fn, inputs, outputs) -> None:
    """Run ``fn`` (quick page work, outside the queue) once the event ``run`` has ended, well or not: gradio's
    then() follows a success only, failure() the rest."""
    for follow in (run.then, run.failure):
        follow(fn, inputs, outputs, queue=False, api_visibility="private", show_progress="hidden")
