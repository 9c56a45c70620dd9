"""What the History tab says about past outputs, as markdown (pure; no gradio)."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from engine.events import PHASES
from engine.outputs.history import HistoryEntry, Unreadable
from engine.planning.explain import strategy_words
from engine.settings.loras import lora_line
from engine.settings.values import MODE_NAMES
from engine.words import plural
from ui.views.job_view import phase_label
from ui.views.text import plain

NOTHING_CHOSEN = "Pick an output in the gallery to see its settings and timings."


def escape_markdown(text: str) -> str:
    """User text (a prompt, a model name) shown literally: no HTML, no markdown formatting, one line."""
    return plain(text, one_line=True)


def _gb(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f} GB"


def _size(entry: HistoryEntry) -> str:
    """The file's size and length (as written: after any smoother or larger step)."""
    made = entry.made or {"frames": entry.settings.frames, "width": entry.settings.width,
                          "height": entry.settings.height}
    if entry.kind == "image":
        return f"{made['width']}x{made['height']}, image"
    fps = f" at {entry.fps} fps ({(made['frames'] - 1) / entry.fps:.1f} s)" if entry.fps else ""
    return f"{made['width']}x{made['height']}, {plural(made['frames'], 'frame')}{fps}"


# How a thumbnail names the way an output was made.
CAPTION_KINDS = {"t2v": "T2V", "i2v": "I2V", "v2v": "V2V", "t2i": "Still"}


def gallery_caption(entry: HistoryEntry, words: int = 8) -> str:
    """A thumbnail's caption, by what tells it from its neighbours: how it was made (an extension as one), its
    frames and size as written, its smoother and larger steps, its seed (the videos of one job differ by it), the
    time, then the prompt's first words: "T2V · 241 fr 832x480 · smoother 2x · seed 7 · 12-07 14:05:31 · a red fox
    running through the snow"."""
    made = entry.made or {"frames": entry.settings.frames, "width": entry.settings.width,
                          "height": entry.settings.height}
    kind = "Extension" if entry.extend else CAPTION_KINDS.get(entry.settings.mode, entry.settings.mode.upper())
    shape = f"{made['width']}x{made['height']}" if entry.kind == "image" else \
        f"{made['frames']} fr {made['width']}x{made['height']}"
    steps = [f"{ {'interpolate': 'smoother', 'upscale': 'larger'}.get(step.get('step'), step.get('step'))} "
             f"{step.get('factor')}x" for step in entry.post if isinstance(step, dict)]
    prompt = entry.prompt.split()
    said = " ".join(prompt[:words]) + (" ..." if len(prompt) > words else "")
    when = entry.created[5:19].replace("T", " ")   # to the second: runs of one minute differ
    return " · ".join([kind, shape, *steps, f"seed {entry.seed}", when, said or "(no prompt)"])


def post_words(post: list) -> str:
    """The steps after the run, as a row says them: "Smoother 2x (RIFE 4.7, 3.1 s); Larger 2x (Lanczos, 0.4 s)"."""
    names = {"interpolate": "Smoother", "upscale": "Larger"}
    words = []
    for step in post:
        seconds = step.get("seconds")
        took = f", {seconds:.1f} s" if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) else ""
        words.append(f"{names[step['step']]} {step['factor']}x ({step.get('method', '')}{took})")
    return "; ".join(words)


def extend_words(record: dict, there: bool) -> str:
    """An extension's record as a row says it: the video it continued, the frames of each part, how they were
    joined, and whether that video is still there to extend again."""
    parts = [part for part in record.get("parts") or [] if isinstance(part, dict)]
    frames = " + ".join(str(part.get("frames", "?")) for part in parts)
    joined = "its frames copied as they were" if str(record.get("how", "")).startswith("streams copied") else \
        "encoded again"
    gone = "" if there else " (no longer there: Reuse settings cannot extend it again)"
    return (f"{record.get('source', '?')}{gone}: {len(parts)} parts, {frames} frames, joined with {joined}, its "
            "colours matched")


def _timings_table(timings: dict[str, float], device: str | None = None) -> list[str]:
    if not timings:
        return ["_No phase timings were recorded._"]
    ordered = [p for p in PHASES if p in timings] + [p for p in timings if p not in PHASES]
    lines = ["| Phase | Seconds |", "|---|---:|"]
    lines += [f"| {escape_markdown(phase_label(p, device))} | {timings[p]:.2f} |" for p in ordered]
    lines.append(f"| **Total** | **{sum(timings.values()):.2f}** |")
    return lines


def entry_markdown(entry: HistoryEntry) -> str:
    """Settings, timings and peaks of one output: enough to understand it and to run it again."""
    images = ""
    if entry.settings.mode == "i2v":
        kept = [name for name, path in (("first frame", entry.first_image), ("last frame", entry.last_image)) if path]
        images = ", ".join(kept) + " kept" if kept else "not kept (an older output): drop the image again to reuse it"
    rows = [
        ("Created", escape_markdown(entry.created.replace("T", " "))),
        ("Mode", MODE_NAMES.get(entry.settings.mode, entry.settings.mode).capitalize()),
        ("Model", escape_markdown(entry.settings.model)),
        ("Preset", escape_markdown(entry.preset or "none")),
        ("Size", _size(entry)),
        ("Steps", str(entry.settings.steps)),
        ("Guidance", f"{entry.settings.guidance:g}"),
        ("Shift", f"{entry.settings.shift:g}"),
        ("Seed", str(entry.seed)),
        ("Memory plan", escape_markdown(strategy_words(entry.strategy, entry.device)[0] if entry.strategy else "n/a")),
        ("Peak VRAM / RAM", f"{_gb(entry.peak_vram_gb)} / {_gb(entry.peak_ram_gb)}"),
    ]
    if entry.settings.loras:
        rows.append(("LoRAs", escape_markdown("; ".join(lora_line(lora) for lora in entry.settings.loras))))
    speed = speed_words(entry.speed)
    if speed:
        rows.append(("Speed", escape_markdown(speed)))
    if entry.post:
        rows.append(("After the run", escape_markdown(post_words(entry.post))))
    if images:
        rows.append(("Input images", images))
    if entry.settings.mode == "v2v":
        rows.append(("Strength", f"{entry.settings.strength:g} ({plural(entry.settings.denoise_steps, 'step')} of "
                                 f"{entry.settings.steps} run)"))
        rows.append(("Input video", "kept" if entry.input_video else "not kept: drop the video again to reuse it"))
    if entry.extend is not None:
        rows.append(("Extends", escape_markdown(extend_words(entry.extend, entry.extends is not None))))
    rows.append(("File", escape_markdown(Path(entry.media).name)))
    lines = [f"**Prompt:** {escape_markdown(entry.prompt) or '_(empty)_'}", ""]
    if entry.negative_prompt:
        lines += [f"**Negative prompt:** {escape_markdown(entry.negative_prompt)}", ""]
    lines += ["| Setting | Value |", "|---|---|", *(f"| {name} | {value} |" for name, value in rows), ""]
    lines += ["**Where the time went**", "", *_timings_table(entry.timings, entry.device)]
    if entry.note:
        lines += ["", f"_{escape_markdown(entry.note)}_"]
    return "\n".join(lines)


def speed_words(speed: dict) -> str:
    """A run's speed record as one line: its decoder, step cache, attention, compiling and VAE precision; what
    of it is approximate is said ('' for a record without any)."""
    parts = []
    if speed.get("decoder"):
        parts.append(f"decoder {speed['decoder']}")
    if speed.get("step_cache"):
        parts.append(f"step cache {speed['step_cache']}")
    if speed.get("attention"):
        parts.append(f"attention {speed['attention']}")
    if speed.get("compiled"):
        parts.append("compiled")
    if speed.get("vae_dtype"):
        parts.append(f"VAE in {speed['vae_dtype']}")
    if speed.get("loras"):
        parts.append(f"LoRAs {speed['loras']}")
    if not parts:
        return ""
    return ", ".join(parts) + (" (approximate)" if speed.get("approximate") else " (exact)")


def reused_markdown(entry: HistoryEntry) -> str:
    """The tab's status once Reuse settings filled its form: what from (an earlier job's words would mislead)."""
    return (f"**Settings of {escape_markdown(Path(entry.media).name)} filled in** (its seed too): press Generate "
            "to make it again, or change them first.")


def started_markdown(entry: HistoryEntry, kind: str) -> str:
    """The tab's status once Extend or Video to Video put an output's video there."""
    name = escape_markdown(Path(entry.media).name)
    if kind == "i2v":
        return (f"**Extending {name}:** the new part starts from its last frame, with its prompt, size and factors "
                "filled in; set the frames and the prompt of what comes next, then press Generate.")
    return (f"**{name} is the input video:** its prompt and shape are filled in; write what it should become, set the "
            "strength, then press Generate.")


def confirm_markdown(entry: HistoryEntry) -> str:
    what = "video" if entry.kind == "video" else "image"
    return (f"**Delete {escape_markdown(Path(entry.media).name)}?** This removes the {what}, its settings "
            "(sidecar), any saved latents and the kept input images. It cannot be undone.")


# How many unreadable sidecars the summary names; the rest are counted.
NAMED_UNREADABLE = 5


def summary_markdown(count: int, limit: int, unreadable: Sequence[Unreadable] = ()) -> str:
    """How many outputs are listed and, by name, the sidecars that could not be read (left out of the list)."""
    if not count:
        listing = "No outputs yet: what you generate appears here, newest first."
    else:
        more = f" (the newest {limit}; older ones stay in the outputs folder)" if count >= limit else ""
        listing = f"{count} output{'s' if count != 1 else ''}, newest first{more}. Click one to see its settings."
    return listing + unreadable_markdown(unreadable)


def unreadable_markdown(unreadable: Sequence[Unreadable]) -> str:
    """A sentence naming the sidecars that could not be read, and why (empty when there are none)."""
    if not unreadable:
        return ""
    named = "; ".join(f"{escape_markdown(u.name)} ({escape_markdown(u.why)})" for u in unreadable[:NAMED_UNREADABLE])
    rest = len(unreadable) - NAMED_UNREADABLE
    others = f"; and {plural(rest, 'other')}" if rest > 0 else ""
    return (f" {plural(len(unreadable), 'sidecar')} could not be read, so "
            f"{'its output is' if len(unreadable) == 1 else 'their outputs are'} left out: {named}{others}. "
            "Fix or remove those files in the outputs folder.")
