"""The whole page: one tab module each, wired to the worker client and the job queue."""
from __future__ import annotations

import gradio as gr

from engine import APP_NAME, __version__
from engine.service.model_files import LoadedFiles
from ui import simple_api
from ui.context import AppContext
from ui.generate import owner_of
from ui.parts import system_panel
from ui.parts.render_lock import one_render_at_a_time
from ui.tabs import decode_again as decode_tab
from ui.tabs import history as history_tab
from ui.tabs import image_to_video as i2v_tab
from ui.tabs import models as models_tab
from ui.tabs import presets as presets_tab
from ui.tabs import text_to_video as t2v_tab
from ui.tabs import video_to_video as v2v_tab
from ui.tabs.ids import TAB_IDS

# Jobs waiting beyond this are refused with a "queue full" message (serve --max-queue N changes it).
MAX_QUEUE = 16
# Pages whose state the server keeps (gradio keeps each visitor's values, about 0.33 MB a page with this app,
# measured in docs/reliability.md; its default of 10,000 would let the server grow by some 3 GB): the oldest
# page beyond this loses its state and is asked to reload.
STATE_SESSIONS = 300
# Threads the server may use: every waiting job holds one while it waits its turn, and the page's own
# events (the system panel, the plan, the history) need theirs.
SERVER_THREADS = 40
# The page's own styles: results at their own size (a 64x64 video is not blown up to the column's width),
# the status as a box of its own, the preset cards' buttons as buttons.
# The page's own script: Enter in a LoRA slider's or the strength slider's number box commits it as Tab does
# (gradio's slider takes a typed value when its box loses focus).
# A video dropped on (or picked for) an image input is stopped before gradio answers "Invalid file type ... Only
# image/* allowed", and one sentence under the input says where a video goes.
PAGE_JS = """
() => {
  document.addEventListener("keydown", (event) => {
    const box = event.target;
    if (event.key === "Enter" && box instanceof HTMLInputElement && box.type === "number"
        && box.closest("[id*='-lora-slider-'], [id$='-strength']")) {
      event.preventDefault();
      box.blur();
    }
  });
  const IMAGE_INPUTS = "#i2v-image, #i2v-last-image";
  const videoIn = (files) => [...(files || [])].find((file) => file.type.startsWith("video/"));
  const say = (zone, video) => {
    const row = zone.closest(".row") || zone;   // under the row of both image boxes, its full width
    let note = row.parentElement.querySelector(":scope > .wan-video-on-image");
    if (!note) {
      note = document.createElement("div");
      note.className = "wan-video-on-image wan-status";
      row.after(note);
    }
    note.textContent = video ? `${video.name} is a video, and this box takes an image (the frame the video starts `
      + "from): to continue a video, open \u201cExtend a video\u201d below and put it in \u201cVideo to extend\u201d "
      + "(or pick it on the History tab and press Extend)." : "";
  };
  const stop = (event, files) => {
    const zone = event.target instanceof Element && event.target.closest(IMAGE_INPUTS);
    if (!zone) return;
    const video = videoIn(files);
    say(zone, video);
    if (video) {
      event.preventDefault();
      event.stopImmediatePropagation();
      if (event.target instanceof HTMLInputElement) event.target.value = "";
    }
  };
  document.addEventListener("drop", (event) => stop(event, event.dataTransfer && event.dataTransfer.files), true);
  document.addEventListener("change", (event) => stop(event, event.target.files), true);
}
"""
PAGE_CSS = """
#t2v-video video, #i2v-video video, #v2v-video video, #decode-video video, #history-video video,
#t2i-image img { width: auto !important; height: auto !important; max-width: 100%; max-height: 100%;
                 margin: 0 auto; display: block; object-fit: contain; }
.wan-status:not(:empty) { border-left: 3px solid var(--color-accent); padding-left: 10px; }
.preset-card button { border: 1px solid var(--button-primary-border-color); }
#app-title h1 { margin-bottom: 0; }
#app-title small { font-size: 0.45em; font-weight: 400; }
"""


def server_threads(max_queue: int) -> int:
    return max(SERVER_THREADS, max_queue + 24)


def build_app(ctx: AppContext) -> gr.Blocks:
    """The page; ``ctx.jobs.max_waiting`` jobs may wait their turn, beyond that a submission is refused."""
    one_render_at_a_time()
    with gr.Blocks(title=APP_NAME) as demo:
        gr.Markdown(f"# {APP_NAME} <small>v{__version__}: Wan video generation on your own machine</small>",
                    elem_id="app-title")
        after_job = system_panel.build(ctx)
        with gr.Tabs() as tabs:
            with gr.Tab("Text to Video", id=TAB_IDS["t2v"]):
                t2v_form = t2v_tab.build(ctx, after_job)
            with gr.Tab("Image to Video", id=TAB_IDS["i2v"]):
                i2v_form = i2v_tab.build(ctx, after_job)
            with gr.Tab("Video to Video", id=TAB_IDS["v2v"]):
                v2v_form = v2v_tab.build(ctx, after_job)
            with gr.Tab("Presets", id=TAB_IDS["presets"]):
                presets_tab.build(ctx, tabs, {"t2v": t2v_form, "i2v": i2v_form})
            with gr.Tab("History", id=TAB_IDS["history"]):
                history_tab.build(ctx, tabs, {"t2v": t2v_form, "i2v": i2v_form, "v2v": v2v_form})
            with gr.Tab("Decode again", id=TAB_IDS["decode"]) as decode:
                decode_tab.build(ctx, decode.select)
            with gr.Tab("Models", id=TAB_IDS["models"]) as models:
                models_tab.build(ctx, models.select)
        with gr.Row():
            unload_btn = gr.Button("Unload model (free its memory)", size="sm", elem_id="unload", scale=0,
                                   min_width=260)
            unload_status = gr.Markdown(elem_id="unload-status")

        def unload_model(session: gr.Request = None):
            # In the queue like a job: it waits for the running one to end instead of cutting in.
            # Every engine's model goes: the turn waits until all of them are free.
            def held():
                return any(not isinstance(files, LoadedFiles) or files.model for files in ctx.client.all_loaded_files())

            if not held() and not ctx.jobs.running_jobs:   # nothing to wait for, nothing to give back
                return "No model was loaded: nothing to unload."
            with ctx.jobs.turn(owner_of(session), "unload", engines=ctx.jobs.engines):
                had = held()
                ctx.client.unload()
                for slot in range(ctx.jobs.engines):
                    ctx.jobs.forget(slot)
            return ("The model was unloaded; the next run loads it again." if had else
                    "No model was loaded: nothing to unload.")

        unload_btn.click(unload_model, None, unload_status, api_name="unload", concurrency_id="unload")
        simple_api.build(ctx)
    # The JobQueue orders the engine's jobs; gradio's own queue only passes events on.
    demo.queue(max_size=ctx.jobs.max_waiting + 8, default_concurrency_limit=1)
    return demo
