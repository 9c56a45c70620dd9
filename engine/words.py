"""How the app's messages are written: whole sentences, counted nouns."""
from __future__ import annotations


def sentence(text: str) -> str:
    """``text`` as a sentence: a capital first letter and a full stop (or its own ? or !) at the end."""
    text = text.strip()
    if not text:
        return text
    text = text[0].upper() + text[1:]
    return text if text.endswith((".", "?", "!")) else text + "."


def plural(count: int, word: str) -> str:
    """'1 frame', '9 frames'."""
    return f"{count} {word}" if count == 1 else f"{count} {word}s"
