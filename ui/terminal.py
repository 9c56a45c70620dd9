"""How a job shows in a terminal (app.py's generate and decode): its phases as lines, its steps as a bar, its
timings as a table, Ctrl-C as a cancel at the next step; the exit code says how it ended."""
from __future__ import annotations

import sys

# Exit codes of `generate` and `decode`.
EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_CANCELLED = 0, 1, 2, 130


def print_timings(view, out) -> None:
    rows = view.timing_rows()
    if not rows:   # refused before anything ran
        return
    width = max(len(r[0]) for r in rows) if rows else 10
    print("Phase timings:", file=out)
    for label, seconds, detail in rows:
        shown = f"{seconds:9.3f} s" if seconds is not None else "        - "
        print(f"  {label:<{width}} {shown}  {detail}", file=out)


def started_then_run(pool, request, note_every: float):
    """The engines started (the job's first phase, with a line every few seconds while torch loads), then the
    job's events; a GPU choice the machine cannot give ends it as bad input."""
    import time

    from engine.events import Info, JobFailed, Phase, PhaseFinished, PhaseStarted

    job_id = pool.new_job_id()
    yield PhaseStarted(job_id, Phase.ENGINE_START)
    start = time.monotonic()
    pool.start(every=False)
    while not pool.started:
        pool.wait_started(note_every)
        if not pool.started:
            yield Info(job_id, f"loading torch and diffusers in the engine process: {time.monotonic() - start:.0f} s")
    yield PhaseFinished(job_id, Phase.ENGINE_START, time.monotonic() - start)
    if pool.problem:
        yield JobFailed(job_id, pool.problem, "", kind="input")
        return
    engines = pool.engine_count()
    more = request.settings.gpus > engines
    notes = [f"--split {request.settings.gpus} asks for more GPUs than --gpus gives ({engines}), so it runs on "
             f"{engines}."] if more else []
    yield from pool.submit(request, job_id, notes=notes)


def on_ctrl_c(handler):
    """Make ``handler`` Ctrl-C's (in the main thread only, where Python allows it); the one it replaces."""
    import signal
    import threading

    if handler is None or threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGINT, handler)


def show(event, view, tty: bool) -> None:
    """One event on stderr: a phase as its heading, a note indented, a step as the progress bar (redrawn in place
    on a terminal)."""
    from engine.events import Info, PhaseStarted, PlanReady, PostProgress, StepFinished, VideoStarted, WindowDone
    from ui.views.job_view import PLAN_NOTE, plan_line

    if isinstance(event, VideoStarted):
        print(f"[Video {event.video} of {event.videos}]", file=sys.stderr)
    elif isinstance(event, PhaseStarted):
        print(f"[{view.label(event.phase)}]", file=sys.stderr)
    elif isinstance(event, PlanReady):   # its heading; the reasons follow as its points
        print(f"  {plan_line(event)}", file=sys.stderr)
    elif isinstance(event, Info) and event.message.startswith(PLAN_NOTE):
        print(f"    - {event.message.removeprefix(PLAN_NOTE)}", file=sys.stderr)
    elif isinstance(event, Info):
        print(f"  {event.message}", file=sys.stderr)
    elif isinstance(event, WindowDone) and tty:   # within the step's line, redrawn (a log gets the steps alone)
        filled = int(30 * (event.step - 1) / event.total)
        bar = "#" * filled + "." * (30 - filled)
        print(f"\r  [{bar}] step {event.step}/{event.total}  window {event.window} of {event.windows}   ", end="",
              file=sys.stderr, flush=True)
    elif isinstance(event, PostProgress) and (tty or event.done == event.total):
        line = f"  frame {event.done} of {event.total}"
        print(("\r" + line) if tty else line, end="" if tty and event.done < event.total else "\n",
              file=sys.stderr, flush=True)
    elif isinstance(event, StepFinished):
        filled = int(30 * event.step / event.total)
        bar = "#" * filled + "." * (30 - filled)
        line = f"  [{bar}] step {event.step}/{event.total}  {event.seconds:.2f} s/step  ETA {event.eta_seconds:.0f} s"
        print(("\r" + line) if tty else line, end="" if tty and event.step < event.total else "\n",
              file=sys.stderr, flush=True)


def follow(client, events) -> int:
    """Print a job's progress and timings; the exit code says how it ended."""
    from engine.events import JobCancelled, JobFailed, JobFinished
    from ui.views.job_view import JobView

    view = JobView()
    tty = sys.stderr.isatty()
    interrupted = []

    def ctrl_c(signum, frame):
        # Handled here, not as KeyboardInterrupt: raised inside the events' generator, that would end it.
        if interrupted:   # a second Ctrl-C: stop waiting for the engine to say it stopped
            raise KeyboardInterrupt
        interrupted.append(True)
        print("\nCancelling at the next step (Ctrl-C again to stop at once)...", file=sys.stderr, flush=True)
        client.cancel()

    previous = on_ctrl_c(ctrl_c)
    try:
        for event in events:
            view.apply(event)
            show(event, view, tty)
    except KeyboardInterrupt:
        print("\nStopped.", file=sys.stderr)
        return EXIT_CANCELLED
    finally:
        on_ctrl_c(previous)
        client.close()
    print_timings(view, sys.stdout)
    if isinstance(view.result, JobFinished):
        result = view.result
        for path, sidecar, seed in zip(result.paths, result.sidecars or (result.sidecar,), result.seeds or (result.seed,)):
            print(f"Wrote {path}")
            print(f"Sidecar {sidecar}")
            print(f"Seed {seed}")
        if view.result.note:
            print(view.result.note)
        return EXIT_OK
    if isinstance(view.cancelled, JobCancelled):
        print(view.status, file=sys.stderr)
        return EXIT_CANCELLED
    failure = view.failure
    if not isinstance(failure, JobFailed):   # the events ended without an ending (the engine went away)
        print(f"error: {view.status or 'the job ended without saying how'}", file=sys.stderr)
        return EXIT_CANCELLED if interrupted else EXIT_FAILED
    if len(failure.problems) > 1:
        print(f"error: {view.status}", *(f"  - {problem}" for problem in failure.problems), sep="\n", file=sys.stderr)
    else:
        print(f"error: {failure.text}", file=sys.stderr)
    if failure.latents:
        print(f"Latents saved: {failure.latents}\nDecode them again with: python app.py decode {failure.latents} "
              "--tiled (or --cpu)", file=sys.stderr)
    return EXIT_BAD_INPUT if failure.kind in ("input", "model") else EXIT_FAILED
