"""The 'where the time goes' bar chart, as self-contained HTML (pure; no gradio)."""
from __future__ import annotations

import html

# One colour per phase (of engine.events.PHASES, which gives their order), so a phase keeps its colour from run
# to run; any other is grey.
PHASE_COLOURS = {
    "download": "#8e8e8e", "load": "#6c8ebf", "transfer": "#82b366", "lora": "#b5739d", "text_encode": "#d6b656",
    "image_encode": "#d79b00", "denoise": "#b85450", "expert_swap": "#ae4132", "vae_decode": "#9673a6", "export": "#10739e",
    "interpolate": "#3d9970", "upscale": "#6a5acd", "video_encode": "#c27c0e", "join": "#2e8b8b",
}
STEP_BARS_MAX = 120   # more steps than this are shown as the last STEP_BARS_MAX


def _width(seconds: float | None, longest: float) -> float:
    return 0.0 if not seconds or longest <= 0 else max(1.0, 100.0 * seconds / longest)


def _short(seconds: float) -> str:
    """A predicted time with the figures it needs: '12.3', '0.42', '0.003', '<0.001' (never '0.0' for a short
    phase)."""
    return (f"{seconds:.1f}" if seconds >= 1 else f"{seconds:.2f}" if seconds >= 0.01 else
            f"{seconds:.3f}" if seconds >= 0.0005 else "<0.001")


def _bar_row(label: str, seconds: float | None, longest: float, colour: str, predicted: float | None = None,
             started: bool = True, ended: str = "") -> str:
    """A phase's bar; with ``predicted``, a thin bar under it for the time the plan predicted (alone, faded,
    for a phase still to come); ``ended``: how a phase without seconds ended (failed, cancelled), else it runs."""
    if not started:
        value = f"about {_short(predicted)} s"
    else:
        value = (ended or "running") if seconds is None else f"{seconds:.2f} s"
        if predicted is not None:
            value += f" · predicted {_short(predicted)}"
    bar = (f'<span style="display:block;height:10px;width:{_width(seconds, longest):.1f}%;background:{colour};'
           'border-radius:3px"></span>') if started else ""
    guess = (f'<span class="wan-predicted" style="display:block;height:4px;margin-top:1px;'
             f'width:{_width(predicted, longest):.1f}%;background:{colour};opacity:0.45;border-radius:2px"></span>'
             if predicted is not None else "")
    return (
        f'<div style="display:flex;align-items:center;gap:8px;margin:2px 0;opacity:{1 if started else 0.7}">'
        f'<span style="flex:0 0 9.5em;font-size:0.85em">{html.escape(label)}</span>'
        '<span style="flex:1 1 auto;background:rgba(128,128,128,0.15);min-height:15px;border-radius:3px">'
        f'{bar}{guess}</span>'
        f'<span style="flex:0 0 12em;font-size:0.8em;text-align:right">{html.escape(value)}</span></div>')


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
                      total_steps: int, predicted: dict | None = None,
                      upcoming: list[tuple[str, str]] = (), ended: dict | None = None) -> str:
    """Bars for (phase, label, seconds or None while running) in run order, each with the seconds the plan
    predicted for it (``predicted``: phase -> seconds) beneath; then the (phase, label) still ``upcoming``,
    predicted only; then one bar per step. ``ended``: phase -> how it ended, for one the job stopped in."""
    ended = ended or {}
    if not phases and not upcoming:
        return ""
    predicted = predicted or {}
    longest = max([s for _, _, s in phases if s] + [s for p, s in predicted.items() if s], default=0.0)
    rows = [_bar_row(label, seconds, longest, PHASE_COLOURS.get(phase, "#999"), predicted.get(phase),
                     ended=ended.get(phase, ""))
            for phase, label, seconds in phases]
    rows += [_bar_row(label, None, longest, PHASE_COLOURS.get(phase, "#999"), predicted[phase], started=False)
             for phase, label in upcoming if phase in predicted]
    steps = _step_bars(step_seconds, total_steps) if step_seconds else ""
    return f'<div class="wan-timing-chart">{"".join(rows)}{steps}</div>'
