"""The system panel: device, device memory and RAM in use, what the engine holds and does.

Refreshed every few seconds while the page is open, idle or during a run, and at once when a job of
this page ends; the engine process answers on its own status channel, so a running job never blocks it.
Every visitor sees it: it names what runs and how the last job ended, never anyone's prompt or messages.
"""
from __future__ import annotations

from pathlib import Path

import gradio as gr

from engine.device.hardware import GIB
from engine.device.usage import EngineMemory, EngineSilent, EngineStarting
from engine.events import JobEnding
from engine.models.refs import is_hub_ref
from engine.models.selftest import SELFTEST_REFS
from engine.planning.planner import strategy_words
from engine.service.watchdog import SILENCE_LIMIT_S
from ui.context import AppContext
from ui.parts.chains import when_ended
from ui.views.job_view import ending_words
from ui.views.text import code

REFRESH_SECONDS = 2.0


def _gb(value: float | None) -> str:
    return "?" if value is None else f"{value:.1f} GB"


def _ago(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s ago"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.1f} h ago"


def system_markdown(memory: EngineMemory | EngineStarting | EngineSilent | None, ram_total: int, ram_available: int,
                    running: str | None, last: tuple[JobEnding, float] | None = None, waiting: int = 0) -> str:
    """Two compact lines: the machine, then the engine (pure, for tests). ``running`` is what the running job
    does; ``last`` how the last job ended and how long ago (shown while idle, so a job shorter than the
    refresh is seen too); ``waiting`` how many jobs wait their turn."""
    ram_used = (ram_total - ram_available) / GIB
    ram = f"RAM {ram_used:.1f} / {ram_total / GIB:.1f} GB in use"
    queue = f" · {waiting} waiting" if waiting else ""
    if memory is None:
        return f"**System:** {ram}  \n**Engine:** not running (it starts with the app and again after a fault){queue}"
    if isinstance(memory, EngineSilent):
        doing = f" · last said: {running}" if running else ""
        return (f"**System:** {ram}  \n**Engine:** not answering (stopped, or hung in a driver call); a job on it "
                f"is stopped and a fresh engine started after {SILENCE_LIMIT_S:.0f} s of silence{doing}{queue}")
    if isinstance(memory, EngineStarting):
        doing = f" · {running}" if running else ""
        return (f"**System:** {ram}  \n**Engine:** starting: loading torch and diffusers "
                f"({memory.seconds:.0f} s so far){doing}{queue}")
    device = f"{memory.device_name} ({memory.backend})"
    if memory.vram_total_gb is not None:
        vram = (f"VRAM {_gb(memory.vram_used_gb)} / {_gb(memory.vram_total_gb)} in use "
                f"(engine {_gb(memory.vram_engine_gb)}, cached {_gb(memory.vram_cached_gb)})")
    elif memory.vram_engine_gb is not None:
        vram = f"GPU memory held by the engine {_gb(memory.vram_engine_gb)} (unified with RAM)"
    else:
        vram = "no separate GPU memory"
    strategy = strategy_words(memory.strategy or "", "cpu" if memory.backend == "cpu" else memory.backend)[0]
    model = f"{code(model_name(memory.model))} loaded ({strategy})" if memory.model else "no model loaded"
    state = f"running: {running}" if running else "idle"
    if not running and last is not None:
        ending, seconds = last
        state += f" · last job: {ending_words(ending)} (ended {_ago(seconds)})"
    return (f"**System:** {device} · {vram} · {ram}, engine process {_gb(memory.engine_ram_gb)}  \n"
            f"**Engine:** {state}{queue} · {model}")


def model_name(ref: str) -> str:
    """How every visitor sees the loaded model: a repo id or self-test model as it is, a folder by its name
    only (its path on this machine is nobody else's business)."""
    return ref if is_hub_ref(ref) or ref in SELFTEST_REFS else Path(ref).name


def current_markdown(ctx: AppContext) -> str:
    import psutil

    mem = psutil.virtual_memory()
    running = ctx.jobs.running
    return system_markdown(ctx.client.memory(timeout=2.0), mem.total, mem.available,
                           running.doing if running else None, ctx.jobs.last_ending(), ctx.jobs.waiting)


def build(ctx: AppContext):
    """The panel; returns ``after_job(run)``, which refreshes it as soon as ``run`` has ended."""
    panel = gr.Markdown("**System:** reading...", elem_id="system-panel")
    timer = gr.Timer(REFRESH_SECONDS)

    def refresh() -> str:
        return current_markdown(ctx)

    # Outside the queue: a full queue or a long job must not stop the panel.
    timer.tick(refresh, None, panel, queue=False, show_progress="hidden", api_visibility="private")
    gr.on(None, refresh, None, panel, queue=False, show_progress="hidden", api_name="system",
          api_visibility="public")

    def after_job(run) -> None:
        when_ended(run, refresh, None, panel)
    return after_job
