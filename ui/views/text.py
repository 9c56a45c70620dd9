"""Text that came from someone (a prompt, a model name, a file name, a message quoting them) shown as written:
no HTML, no markdown (no links, no images, no emphasis), never turned into a link.

Only what markdown or HTML would act on is escaped, so that the app's own sentences (which quote such text)
read the same through the API: "Done in 4.5 s. Seed used: 7." stays as it is.
"""
from __future__ import annotations

import html
import re

# Marks that start markup whatever surrounds them: code, emphasis, links and images ('[' and ']': a '(' or '!'
# is harmless without them), tables, strike-through, maths, headings.
_MARKS = re.compile(r"([\\`*\[\]|~$#])")
# '_' emphasises only at the edge of a word ("all_on_device" stays a word).
_UNDERSCORE_AT_EDGE = re.compile(r"(?<![0-9A-Za-z])_|_(?![0-9A-Za-z])")
# What would become a link by itself: "http://..." and "www.example".
_ADDRESS = re.compile(r"(://|\bwww\.)", re.IGNORECASE)


def plain(text, one_line: bool = False) -> str:
    """``text`` for a markdown component, shown literally; ``one_line`` folds its whitespace into spaces."""
    text = str(text)
    if one_line:
        text = " ".join(text.split())
    text = _MARKS.sub(r"\\\1", html.escape(text, quote=False))
    text = _UNDERSCORE_AT_EDGE.sub(r"\\_", text)
    return _ADDRESS.sub(lambda m: m.group(1).replace("/", "\\/").replace(".", "\\."), text)


def code(text) -> str:
    """``text`` as inline code: shown as written (a code span is literal), on one line, without a backtick that
    could end it early."""
    return "`" + " ".join(str(text).split()).replace("`", "'") + "`"
