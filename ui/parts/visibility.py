"""Showing and hiding a component from an event's answer: ``visible=visible_if(flag)``.

A component hidden with ``visible=False`` leaves the page, and it leaves it while it still waits for the answer
that hides it; gradio's status tracker of a component that leaves the page waiting keeps counting the event's time
on every frame the browser draws, for as long as the page stays open (each about 0.7% of a core in headless
Chromium; the page with the CPU-only form rows hidden idled at 8-11% of a core). ``"hidden"`` keeps the component in
the page, out of sight and out of the layout, and its tracker stops as the answer comes. A component that starts
hidden may say ``visible=False`` where it is built: it has no tracker until it is first shown.
"""
from __future__ import annotations

HIDDEN = "hidden"


def visible_if(flag: bool) -> bool | str:
    """``visible=`` of an event's update: shown, or hidden but kept in the page."""
    return True if flag else HIDDEN
