"""The system panel: device, device memory and RAM in use, what the engine holds and does.

Refreshed every few seconds while the page is open, idle or during a run; the engine
process answers on its own status channel, so a running job never blocks it.
"""
from __future__ import annotations

import gradio as gr

from engine.sysinfo import GIB, EngineMemory

from .context import AppContext

REFRESH_SECONDS = 2.0


def _gb(value: float | None) -> str:
    return "?" if value is None else f"{value:.1f} GB"


def _ago(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s ago"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.1f} h ago"


def system_markdown(memory: EngineMemory | None, ram_total: int, ram_available: int,
                    running: str | None, last: tuple[str, float] | None = None) -> str:
    """One compact block: device line, memory line, engine line (pure, for tests). ``last`` is the last
    job's final word and how long ago it ended, shown while idle: a job shorter than the refresh is
    seen there too."""
    ram_used = (ram_total - ram_available) / GIB
    ram = f"RAM {ram_used:.1f} / {ram_total / GIB:.1f} GB in use"
    if memory is None:
        return f"**System:** engine process not started yet (it starts with the first job) · {ram}"
    device = f"{memory.device_name} ({memory.backend})"
    if memory.vram_total_gb is not None:
        vram = (f"VRAM {_gb(memory.vram_used_gb)} / {_gb(memory.vram_total_gb)} in use "
                f"(engine {_gb(memory.vram_engine_gb)}, cached {_gb(memory.vram_cached_gb)})")
    elif memory.vram_engine_gb is not None:
        vram = f"GPU memory held by the engine {_gb(memory.vram_engine_gb)} (unified with RAM)"
    else:
        vram = "no separate GPU memory"
    model = (f"`{memory.model}` loaded ({memory.strategy})" if memory.model else "no model loaded")
    state = f"running: {running}" if running else "idle"
    if not running and last is not None:
        said, seconds = last
        state += f" · last job: {said} (ended {_ago(seconds)})"
    return (f"**System:** {device} · {vram} · {ram}, engine process {_gb(memory.engine_ram_gb)}  \n"
            f"**Engine:** {state} · {model}")


def current_markdown(ctx: AppContext) -> str:
    import psutil

    mem = psutil.virtual_memory()
    return system_markdown(ctx.client.memory(timeout=2.0), mem.total, mem.available, ctx.running.status,
                           ctx.running.last_ended())


def build(ctx: AppContext) -> gr.Markdown:
    panel = gr.Markdown("**System:** reading...", elem_id="system-panel")
    timer = gr.Timer(REFRESH_SECONDS)

    def refresh() -> str:
        return current_markdown(ctx)

    # Outside the queue: a full queue or a long job must not stop the panel.
    timer.tick(refresh, None, panel, queue=False, show_progress="hidden", api_visibility="private")
    gr.on(None, refresh, None, panel, queue=False, show_progress="hidden", api_name="system",
          api_visibility="public")
    return panel
