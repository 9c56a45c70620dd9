"""The errors the app's own checks raise, below every package that raises them (engine/settings/values.py
re-uses InputError for the settings; engine/models/refs.py has ModelError for references and folders)."""
from __future__ import annotations

from engine.words import sentence


class InputError(ValueError):
    """The request cannot run; each problem says what is wrong and what to change.

    Built from one problem or a list of them (short clauses such as "width 70 is not a multiple of 16:
    try 64 or 80"); ``problems`` holds them as sentences, and ``str()`` is those sentences in a row.
    """

    def __init__(self, problems: str | list[str] | tuple[str, ...]):
        listed = [problems] if isinstance(problems, str) else list(problems)
        self.problems = tuple(sentence(p) for p in listed if p.strip())
        super().__init__(" ".join(self.problems))
