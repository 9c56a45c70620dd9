"""One ``@gr.render`` redraw at a time.

gradio redraws a render block in the request that asks for it, on the server's threads. Two redraws of one page at
once (the page's three render blocks as it opens; a LoRA box edited while the presets redraw) change that page's list
of event functions while the other is walking it: gradio raises "dictionary changed size during iteration"
(gradio/renderable.py's ``apply``), the redraw fails and its part of the page stays as it was. Seen in the suite's
browser runs (docs/testing.md). A redraw takes milliseconds; waiting for another costs nothing a person sees, so every
redraw of the server takes one lock."""
from __future__ import annotations

import functools
import threading


def one_render_at_a_time() -> None:
    """Every render block made after this call redraws under one lock (re-entrant: a redraw that redraws inside
    itself goes on). Called before the page is built (ui/app_ui.py); calling it again changes nothing."""
    from gradio.renderable import Renderable

    apply = Renderable.apply
    if getattr(apply, "one_at_a_time", False):
        return
    lock = threading.RLock()

    @functools.wraps(apply)
    def locked(self, *args, **kwargs):
        with lock:
            return apply(self, *args, **kwargs)

    locked.one_at_a_time = True
    Renderable.apply = locked
