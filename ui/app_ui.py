"""The whole page: one tab module each, wired to the worker client."""
from __future__ import annotations

import gradio as gr

from engine import APP_NAME, __version__

from . import decode_tab, history_tab, i2v_tab, presets_tab, simple_api, system_panel, t2v_tab
from .context import AppContext
from .generate import GPU_QUEUE
from .tabs import TAB_IDS

# Jobs waiting beyond this are refused with a "queue full" message (serve --max-queue N changes it).
MAX_QUEUE = 16


def build_app(ctx: AppContext, max_queue: int | None = None) -> gr.Blocks:
    """The page; ``max_queue`` jobs may wait (default MAX_QUEUE), beyond that a submission is refused."""
    with gr.Blocks(title=APP_NAME) as demo:
        gr.Markdown(f"# {APP_NAME}\nWan video generation on your own machine. v{__version__}")
        system_panel.build(ctx)
        with gr.Tabs() as tabs:
            with gr.Tab("Text to Video", id=TAB_IDS["t2v"]):
                t2v_form = t2v_tab.build(ctx)
            with gr.Tab("Image to Video", id=TAB_IDS["i2v"]):
                i2v_form = i2v_tab.build(ctx)
            with gr.Tab("Presets", id=TAB_IDS["presets"]):
                presets_tab.build(ctx, tabs, {"t2v": t2v_form, "i2v": i2v_form})
            with gr.Tab("History", id=TAB_IDS["history"]):
                history_tab.build(ctx, tabs, {"t2v": t2v_form, "i2v": i2v_form})
            with gr.Tab("Decode again", id=TAB_IDS["decode"]):
                decode_tab.build(ctx)
        with gr.Row():
            unload_btn = gr.Button("Unload model (free its memory)", size="sm", elem_id="unload")
            unload_status = gr.Markdown(elem_id="unload-status")

        def unload_model():
            ctx.client.unload()
            return "The model was unloaded; the next run loads it again."

        unload_btn.click(unload_model, None, unload_status, api_name="unload", concurrency_id=GPU_QUEUE)
        simple_api.build(ctx)
    # One GPU job at a time; cancel (queue=False) runs beside it.
    demo.queue(max_size=max_queue or MAX_QUEUE, default_concurrency_limit=1)
    return demo
