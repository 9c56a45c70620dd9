"""The page's tab ids, and finding a Tab by its id (a tab's content refreshes when the tab is opened)."""
from __future__ import annotations

import gradio as gr

TAB_IDS = {"t2v": "t2v-tab", "i2v": "i2v-tab", "v2v": "v2v-tab", "presets": "presets-tab", "history": "history-tab",
           "decode": "decode-tab", "models": "models-tab"}


def tab_by_id(tabs: gr.Tabs, key: str) -> gr.Tab | None:
    """The Tab among ``tabs`` whose id is TAB_IDS[key], or None (a tab built outside the full page)."""
    return next((tab for tab in tabs.children if getattr(tab, "id", None) == TAB_IDS[key]), None)
