"""The 'where the time goes' bar chart, as self-contained HTML (pure; no gradio)."""
from __future__ import annotations

import html

# One colour per phase (of engine.events.PHASES, which gives their order), so a phase keeps its colour from run
# to run; any other is grey.
PHASE_COLOURS = {
    "download": "#8e8e8e", "load": "#6c8ebf", "transfer": "#82b366", "text_encode": "#d6b656",
    "image_encode": "#d79b00", "denoise": "#b85450", "vae_decode": "#9673a6", "export": "#10739e",
}
STEP_BARS_MAX = 120   # more steps than this are shown as the last STEP_BARS_MAX


def _bar_row(label: str, seconds: float | None, longest: float, colour: str, note: str = "") -> str:
    width = 0.0 if not seconds or longest <= 0 else max(1.0, 100.0 * seconds / longest)
    value = "running" if seconds is None else f"{seconds:.2f} s"
    if note:
        value += f" · {note}"
    return (
        '<div style="display:flex;align-items:center;gap:8px;margin:2px 0">'
        f'<span style="flex:0 0 9.5em;font-size:0.85em">{html.escape(label)}</span>'
        '<span style="flex:1 1 auto;background:rgba(128,128,128,0.15);height:14px;border-radius:3px">'
        f'<span style="display:block;height:14px;width:{width:.1f}%;background:{colour};border-radius:3px"></span>'
        '</span>'
        f'<span style="flex:0 0 11em;font-size:0.8em;text-align:right">{html.escape(value)}</span></div>')


def _step_bars(step_seconds: list[float], total_steps: int) -> str:
    shown = step_seconds[-STEP_BARS_MAX:]
    slowest = max(shown)
    bars = "".join(
        f'<span title="step {i}: {s:.3f} s" style="display:inline-block;width:6px;margin-right:1px;'
        f'height:{max(2.0, 40.0 * s / slowest):.1f}px;background:{PHASE_COLOURS["denoise"]};'
        'vertical-align:bottom"></span>'
        for i, s in enumerate(shown, start=len(step_seconds) - len(shown) + 1))
    return ('<div style="margin-top:6px;font-size:0.8em">Seconds per denoising step '
            f'({len(step_seconds)} of {total_steps})</div>'
            f'<div class="wan-step-bars" style="height:42px;display:flex;align-items:flex-end">{bars}</div>')


def timing_chart_html(phases: list[tuple[str, str, float | None]], step_seconds: list[float],
                      total_steps: int) -> str:
    """Bars for (phase, label, seconds or None while running) in run order, then one bar per step."""
    if not phases:
        return ""
    longest = max((s for _, _, s in phases if s), default=0.0)
    rows = [_bar_row(label, seconds, longest, PHASE_COLOURS.get(phase, "#999"))
            for phase, label, seconds in phases]
    steps = _step_bars(step_seconds, total_steps) if step_seconds else ""
    return f'<div class="wan-timing-chart">{"".join(rows)}{steps}</div>'
