"""Jobs of the self-test model sent through a running app's API, and waiting on what its users see of them."""
from __future__ import annotations

import time


def t2v(seed: int, prompt: str = "a red fox", size=(64, 64, 9), steps: int = 4) -> list:
    width, height, frames = size
    return ["selftest-t2v", prompt, "", "selftest-t2v", width, height, frames, steps, 5.0, 3.0, seed]


def long_job(seed: int = 1) -> list:
    return t2v(seed, "a long one", (256, 256, 33), 200)   # minutes on this CPU; every test cancels it


def wait(predicate, timeout: float, what: str, poll: float = 0.02):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(poll)
    raise AssertionError(f"timed out waiting for {what}")


def statuses_of(job) -> list[str]:
    """Every status the job has streamed so far."""
    return [str(output[1]) for output in job.outputs()]


def wait_denoising(job, timeout: float = 60):
    def denoising():
        assert not job.done() or not job.exception(), job.exception()
        return any("Denoising: step" in text for text in statuses_of(job))
    wait(denoising, timeout, "the long job to reach the denoising steps")
