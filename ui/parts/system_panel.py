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
from engine.planning.explain import strategy_words
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
    ram = _ram(ram_total, ram_available)
    queue = f" · {waiting} waiting" if waiting else ""
    if isinstance(memory, EngineMemory):
        return (f"**System:** {_device(memory)} · {_vram(memory)} · {ram}, engine process "
                f"{_gb(memory.engine_ram_gb)}  \n**Engine:** {_state(memory, running, last)}{queue} · {_model(memory)}")
    return f"**System:** {ram}  \n**Engine:** {_state(memory, running, last)}{queue}"


def engines_markdown(memories: list, gpus: tuple[int, ...], ram_total: int, ram_available: int,
                     running: dict[int, str], last: tuple[JobEnding, float] | None = None, waiting: int = 0,
                     cpu: bool = False) -> str:
    """The machine, then one line per engine process (pure, for tests): its GPU, what it does (``running``:
    engine number -> what its job does now; a job split across GPUs is on each of its engines), its memory and
    the model it holds. ``gpus``: each engine's GPU number; ``cpu``: a machine without GPUs, whose engines are
    numbered instead."""
    queue = f" · {waiting} waiting" if waiting else ""
    busy = sum(1 for slot in range(len(memories)) if slot in running)
    lines = [f"**System:** {_ram(ram_total, ram_available)} · {len(memories)} engines, {busy} busy{queue}"]
    for slot, memory in enumerate(memories):
        known = isinstance(memory, EngineMemory)
        gpu = gpus[slot] if slot < len(gpus) else slot
        name = f"Engine {slot}" if cpu else f"GPU {gpu}"
        device = f" ({memory.device_name})" if known and not cpu else ""
        state = _state(memory, running.get(slot), last if not running else None)
        details = f" · {_vram(memory)} · {_model(memory)}" if known else ""
        lines.append(f"**{name}**{device}: {state}{details}")
    return "  \n".join(lines)


def _ram(total: int, available: int) -> str:
    return f"RAM {(total - available) / GIB:.1f} / {total / GIB:.1f} GB in use"


def _device(memory: EngineMemory) -> str:
    return f"{memory.device_name} ({memory.backend})"


def _vram(memory: EngineMemory) -> str:
    if memory.vram_total_gb is not None:
        return (f"VRAM {_gb(memory.vram_used_gb)} / {_gb(memory.vram_total_gb)} in use "
                f"(engine {_gb(memory.vram_engine_gb)}, cached {_gb(memory.vram_cached_gb)})")
    if memory.vram_engine_gb is not None:
        return f"GPU memory held by the engine {_gb(memory.vram_engine_gb)} (unified with RAM)"
    return "no separate GPU memory"


def _model(memory: EngineMemory) -> str:
    strategy = strategy_words(memory.strategy or "", "cpu" if memory.backend == "cpu" else memory.backend)[0]
    return f"{code(model_name(memory.model))} loaded ({strategy})" if memory.model else "no model loaded"


def _state(memory, running: str | None, last: tuple[JobEnding, float] | None) -> str:
    """What an engine process does: not running, not answering, starting, running a job, or idle."""
    if memory is None:
        return "not running (it starts with the app and again after a fault)"
    if isinstance(memory, EngineSilent):
        doing = f" · last said: {running}" if running else ""
        return (f"not answering (stopped, or hung in a driver call); a job on it is stopped and a fresh engine "
                f"started after {SILENCE_LIMIT_S:.0f} s of silence{doing}")
    if isinstance(memory, EngineStarting):
        doing = f" · {running}" if running else ""
        return f"starting: loading torch and diffusers ({memory.seconds:.0f} s so far){doing}"
    state = f"running: {running}" if running else "idle"
    if not running and last is not None:
        ending, seconds = last
        state += f" · last job: {ending_words(ending)} (ended {_ago(seconds)})"
    return state


def model_name(ref: str) -> str:
    """How every visitor sees the loaded model: a repo id or self-test model as it is, a folder by its name
    only (its path on this machine is nobody else's business)."""
    return ref if is_hub_ref(ref) or ref in SELFTEST_REFS else Path(ref).name


def current_markdown(ctx: AppContext) -> str:
    import psutil

    mem = psutil.virtual_memory()
    engines = getattr(ctx.client, "engines", None)
    if engines is not None and len(engines) > 1:
        running = {slot: ticket.doing for ticket in ctx.jobs.running_jobs for slot in ticket.slots}
        return engines_markdown(ctx.client.memories(timeout=2.0), ctx.client.gpus, mem.total, mem.available,
                                running, ctx.jobs.last_ending(), ctx.jobs.waiting,
                                cpu=ctx.client.hardware_profile().gpu_count == 0)
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
