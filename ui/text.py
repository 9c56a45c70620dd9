"""Text that came from someone (a prompt, a model name, a file name, a message quoting them) shown as written:
no HTML, no markdown (no links, no images, no emphasis), never turned into a link."""
from __future__ import annotations

import html
import re

# Every ASCII punctuation mark that markdown or its link detection reads; a backslash before each shows it as it
# is (':' and '.' too, so that no address in someone's text becomes a link).
_MARKDOWN = re.compile(r"([\\`*_{}\[\]()#+\-.!|~>:$])")


def plain(text, one_line: bool = False) -> str:
    """``text`` for a markdown component, shown literally; ``one_line`` folds its whitespace into spaces."""
    text = str(text)
    if one_line:
        text = " ".join(text.split())
    return _MARKDOWN.sub(r"\\\1", html.escape(text, quote=False))


def code(text) -> str:
    """``text`` as inline code: shown as written (a code span is literal), on one line, without a backtick that
    could end it early."""
    return "`" + " ".join(str(text).split()).replace("`", "'") + "`"
