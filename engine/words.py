"""How the app's messages are written: whole sentences, counted nouns."""
from __future__ import annotations


def sentence(text: str) -> str:
    """``text`` as a sentence: a capital first letter and a full stop (or its own ? or !) at the end. A first word
    that is a name as written (a file, a folder, a model: ``notes.png``, ``selftest-t2v``, ``org/name``: a dot, a
    slash, an underscore or a digit in it) keeps its letters."""
    text = text.strip()
    if not text:
        return text
    first = text.split(maxsplit=1)[0].rstrip(",:;")
    if not (any(mark in first for mark in "./\\_") or any(c.isdigit() for c in first)):
        text = text[0].upper() + text[1:]
    return text if text.endswith((".", "?", "!")) else text + "."


def plural(count: int, word: str) -> str:
    """'1 frame', '9 frames'."""
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def value_kinds(nan: bool, inf: bool) -> str:
    """What values that are no numbers are called: 'NaN', 'infinite', 'NaN and infinite'."""
    return " and ".join(kind for kind, found in (("NaN", nan), ("infinite", inf)) if found)


def share(fraction: float) -> str:
    """A fraction as a message says it: '100%', 'over 99%', '12%', '0.3%', '0.0012%'."""
    if 0.99 < fraction < 1:
        return "over 99%"
    return f"{100 * fraction:.2g}%" if fraction < 0.1 else f"{100 * fraction:.0f}%"


# The most of a value a message repeats: a field sent 5000 characters long is named by its start.
QUOTED_CHARS = 40


def quoted(value) -> str:
    """A value as a message quotes it (its repr), cut to QUOTED_CHARS with '...' past that."""
    text = repr(value) if not isinstance(value, int) or isinstance(value, bool) else show(value)
    return text if len(text) <= QUOTED_CHARS else text[:QUOTED_CHARS] + "..."


def show(number: int) -> str:
    """A whole number for a message: exact as typed (a seed of 100000000000000000000 reads as that), unless
    absurdly long (1e+30 rather than 31 digits; read from its digits, as one past 10^308 is no float)."""
    if abs(number) < 10**21:
        return str(number)
    digits = str(abs(number))
    mantissa = f"{digits[0]}.{digits[1:3]}".rstrip("0").rstrip(".")
    return f"{'-' if number < 0 else ''}{mantissa}e+{len(digits) - 1}"
