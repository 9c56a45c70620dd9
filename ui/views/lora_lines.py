"""The LoRA box's text edited line by line, for the list of sliders under it (pure; no gradio).

The box stays the one place the LoRAs are written (``file: strength[@high|@low]`` a line): the list shows what
it reads and each edit rewrites one line of it, leaving the others (comments, blank lines) as they were.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from engine.models.loras import Lora
from engine.settings.loras import DEFAULT_STRENGTH, lora_line, parse_lora, parse_lora_lines
from engine.settings.values import InputError

# A slider's strengths are written with two decimals at most ("0.85", not "0.8500000001").
STRENGTH_DECIMALS = 2


@dataclass(frozen=True)
class LoraRow:
    """One LoRA of the box: the number of its line (from 0, blank and comment lines counted) and what it reads."""
    line: int
    lora: Lora


def lora_rows(text: str | None) -> list[LoraRow]:
    """A row for each LoRA line of the box; none when any line does not read (the plan says which)."""
    try:
        parse_lora_lines(text)
    except InputError:
        return []
    return [LoraRow(number, parse_lora(line)) for number, line in enumerate((text or "").splitlines())
            if line.strip() and not line.strip().startswith("#")]


def with_lora(text: str | None, file: str) -> str:
    """The box with ``file: 1`` on a line of its own at the end; as it was when a line already puts that file
    into every expert."""
    text = text or ""
    if any(_reads(line) == (file, "both") for line in text.splitlines()):
        return text
    line = lora_line(Lora(file, DEFAULT_STRENGTH))
    return f"{text.rstrip()}\n{line}" if text.strip() else line


def with_strength(text: str | None, row: LoraRow, strength: float) -> str:
    """The box with ``row``'s line at ``strength``: its file as written and its expert kept. As it was when that
    line no longer holds that LoRA (the box was edited meanwhile)."""
    lines = (text or "").splitlines()
    if not _holds(lines, row):
        return text or ""
    lora = Lora(row.lora.file, round(float(strength), STRENGTH_DECIMALS) + 0.0, row.lora.expert)
    lines[row.line] = lora_line(lora)
    return "\n".join(lines)


def typed_strength(value, most: float) -> tuple[float | None, str]:
    """(the strength to use, what to tell the person) for a value typed into a slider's box: within -most..most as
    typed; beyond it, the nearest end, said; not a number, None, said."""
    try:
        strength = float(value)
    except (TypeError, ValueError):
        strength = math.nan
    if not math.isfinite(strength):
        return None, f"A LoRA strength is a number from {-most:g} to {most:g}; the strength was left as it was."
    if abs(strength) <= most:
        return strength, ""
    nearest = math.copysign(most, strength)
    return nearest, f"A LoRA strength goes from {-most:g} to {most:g}: {strength:g} was set to {nearest:g}."


def without(text: str | None, row: LoraRow) -> str:
    """The box without ``row``'s line; as it was when that line no longer holds that LoRA."""
    lines = (text or "").splitlines()
    if not _holds(lines, row):
        return text or ""
    return "\n".join(lines[:row.line] + lines[row.line + 1:])


def _holds(lines: list[str], row: LoraRow) -> bool:
    return 0 <= row.line < len(lines) and _reads(lines[row.line]) == (row.lora.file, row.lora.expert)


def _reads(line: str) -> tuple[str, str] | None:
    """(file, expert) of a LoRA line; None for a blank, comment or unreadable one."""
    if not line.strip() or line.strip().startswith("#"):
        return None
    try:
        lora = parse_lora(line)
    except InputError:
        return None
    return lora.file, lora.expert
