"""Who owns the running job, and the word a Cancel ends with once that job has stopped."""
from __future__ import annotations

import threading
import time
from ui.context import RunningJob
from ui.generate import cancelled_status


def test_the_cancel_ends_with_its_own_word_only_after_the_job_stopped():
    running = RunningJob()
    running.start("alice")
    running.update("Denoising: step 57/200, 0.04 s/step (23.1 steps/s), about 6 s left")
    stopped_at = []

    def stop_later():
        time.sleep(0.3)
        stopped_at.append(time.monotonic())
        running.finish()

    threading.Thread(target=stop_later).start()
    final = cancelled_status(running, "alice", timeout_s=10)
    answered_at = time.monotonic()
    assert stopped_at and answered_at >= stopped_at[0], "answered before the job stopped"
    assert final == ("Cancelled during Denoising: step 57/200. The model stays loaded; "
                     "your earlier result is kept.")


def test_the_engine_own_cancel_message_is_kept_and_a_finished_job_is_not_called_cancelled():
    running = RunningJob()
    running.start("alice")
    running.update("Cancelled after step 12 of 200. The model stays loaded.")
    running.finish()
    assert cancelled_status(running, "alice", 1).startswith("Cancelled after step 12 of 200.")
    running.start("alice")
    running.update("Done in 3.2 s. Seed used: 7.")
    running.finish()
    assert cancelled_status(running, "alice", 1).startswith("Nothing of yours was running: your last job had "
                                                           "already finished (Done in 3.2 s.")


def test_others_get_no_final_word_and_a_stuck_job_is_reported_as_not_stopped():
    running = RunningJob()
    running.start("alice")
    running.update("Denoising: step 3/200")
    assert cancelled_status(running, "bob", 1) is None
    start = time.monotonic()
    assert "has not stopped yet" in cancelled_status(running, "alice", timeout_s=0.2)
    assert time.monotonic() - start < 5
    assert running.owned_by("alice")
