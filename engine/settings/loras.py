"""LoRAs as people write them: ``file: strength``, and ``@high`` or ``@low`` for one expert of a two-expert model
(the command line's ``--lora``, one line each on the page).

The text becomes ``Settings.loras``, Lora values (engine/models/loras.py); the files are found here (the page's
in the models folder's ``loras/``), and ``values.check_settings`` then checks each file, strength and expert.
"""
from __future__ import annotations

import math
from pathlib import Path

from engine.models.loras import LORA_EXPERTS, LORA_SUFFIX, Lora
from engine.models.weights import files_under, find_file
from engine.errors import InputError

LORAS_FOLDER = "loras"        # inside the models folder: where the page (and a bare file name) finds LoRA files
DEFAULT_STRENGTH = 1.0
EXAMPLE = "'detail.safetensors: 0.8'"
# What ends a LoRA's text to put it into one expert only (Wan2.2 A14B): '@high' or '@low' ('@both' is the default).
EXPERT_MARK = "@"


def parse_lora(text: str) -> Lora:
    """The Lora ``FILE[:STRENGTH][@high|@low]`` names; the strength is what follows the last ':' when it is a number
    (so a Windows path such as C:\\loras\\a.safetensors needs none), else 1.0; without '@' the LoRA goes into every
    expert. InputError when a strength is written but is no number."""
    text, expert = _expert(text.strip())
    head, colon, tail = text.rpartition(":")
    strength = _number(tail) if colon else None
    if strength is not None:
        if not head.strip():
            raise InputError(f"LoRA {text[:80]!r} has a strength but no file: write {EXAMPLE}")
        return Lora(head.strip(), strength, expert)
    if colon and not text.lower().endswith(".safetensors"):
        raise InputError(f"LoRA {text[:80]!r}: the strength after the last ':' must be a number; write {EXAMPLE}")
    if not text:
        raise InputError(f"a LoRA needs a file: write {EXAMPLE}")
    return Lora(text, DEFAULT_STRENGTH, expert)


def _expert(text: str) -> tuple[str, str]:
    """(the text without its '@high' / '@low' / '@both' end, the expert it names: 'both' without one)."""
    head, mark, tail = text.rpartition(EXPERT_MARK)
    if mark and tail.strip().lower() in LORA_EXPERTS:
        return head.strip(), tail.strip().lower()
    if mark and not tail.lower().endswith(".safetensors") and ":" not in tail and "\\" not in tail and "/" not in tail:
        raise InputError(f"LoRA {text[:80]!r}: after '@' write high (the high-noise expert) or low (the low-noise "
                         "one), as in 'detail.safetensors: 0.8@low'")
    return text, "both"


def lora_line(lora: Lora, file: str | None = None) -> str:
    """How the page's LoRA box (and parse_lora) writes ``lora``: 'file: strength', then '@high' or '@low';
    ``file``: the file as shown (a name for one in the models folder's loras/)."""
    target = "" if lora.expert == "both" else f"{EXPERT_MARK}{lora.expert}"
    return f"{file or lora.file}: {lora.strength:g}{target}"


def _number(text: str) -> float | None:
    try:
        number = float(text.strip())
    except ValueError:
        return None
    return number + 0.0 if math.isfinite(number) else None


def parse_lora_lines(text) -> tuple[Lora, ...]:
    """The page's LoRA box: one ``file: strength`` a line; empty lines and lines starting with '#' are skipped.
    InputError naming every line that does not read."""
    if text is None:
        return ()
    if not isinstance(text, str):
        raise InputError(f"the LoRAs must be text, one {EXAMPLE} a line; got {type(text).__name__}")
    pairs, problems = [], []
    for line in text.splitlines():
        if not line.strip() or line.strip().startswith("#"):
            continue
        try:
            pairs.append(parse_lora(line))
        except InputError as exc:
            problems.extend(exc.problems)
    if problems:
        raise InputError(problems)
    return tuple(pairs)


def lora_folder(models_dir: str | Path) -> Path:
    return Path(models_dir) / LORAS_FOLDER


def find_lora(file: str, models_dir: str | Path, must_exist: bool = False) -> str:
    """The command line's LoRA file as an absolute path: as given, else by that name in the models folder's loras/
    (engine/models/weights.find_file; ``must_exist``: refused naming both places when in neither)."""
    return find_file(file, lora_folder(models_dir), must_exist)


def listed_lora_files(models_dir: str | Path) -> list[str]:
    """The .safetensors files in the models folder's loras/ (and its subfolders), as the LoRA box names them:
    paths relative to it, sorted; none when the folder is not there. Only names: no header is read."""
    return files_under(lora_folder(models_dir), (LORA_SUFFIX,))
