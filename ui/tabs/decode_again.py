"""Decode again: saved latents of runs whose decode failed become a video without denoising again."""
from __future__ import annotations

import gradio as gr

from engine.events import JobFinished
from engine.outputs.latents import saved_latents
from engine.settings.values import InputError
from ui.context import AppContext
from ui.generate import EngineWork, gpu_event, run_job

NONE_SAVED = ("No saved latents: a run keeps its latents here when its VAE decode fails (and a finished run while "
              "--latents-hours keeps them, or with keep_latents), so that it can be decoded again without denoising. "
              "Nothing to decode now.")
# How the list names latents whose run has its video already: decoding them makes another one beside it.
FINISHED = "its video is made; decoding again makes another"


def pending_latents(outputs_dir: str) -> list[tuple[str, str]]:
    """(label, path) of the saved latents to decode again, newest first: those whose run has no video or image yet
    (its decode failed), then those of finished runs, named so (``app.py decode`` takes both)."""
    found = []
    for bundle in saved_latents(outputs_dir):
        path = bundle.latents
        done = bundle.has_media()
        label = f"{path.parent.name} / {bundle.stem.name}" + (f" ({FINISHED})" if done else "")
        found.append((done, -path.stat().st_mtime, label, str(path)))
    return [(label, path) for _, _, label, path in sorted(found)]


def listing(outputs_dir: str) -> tuple:
    """The list of saved latents, the buttons (usable only when there is something to decode) and a note."""
    pending = pending_latents(outputs_dir)
    failed = sum(FINISHED not in label for label, _ in pending)
    note = NONE_SAVED if not pending else (f"{len(pending)} saved latents to decode again, the newest first: {failed} "
                                           f"of runs whose decode failed, {len(pending) - failed} of finished runs "
                                           "(decoding those makes another video beside theirs).")
    return (gr.Dropdown(choices=pending, value=pending[0][1] if pending else None, interactive=bool(pending)),
            gr.Button(interactive=bool(pending)), gr.Button(interactive=bool(pending)), note)


def build(ctx: AppContext, tabs_select=None) -> None:
    """The tab; ``tabs_select`` (the tab's own select event) refreshes its list whenever it is opened."""
    gr.Markdown("Runs whose VAE decode failed keep their denoised latents (finished runs too, while --latents-hours "
                "keeps them). Decode them again here, in tiles (less memory) or on the CPU (slow, no device memory), "
                "without repeating the denoising.")
    pending = pending_latents(ctx.outputs_dir)
    with gr.Row():
        choice = gr.Dropdown(choices=pending, label="Saved latents", scale=4, elem_id="decode-latents",
                             interactive=bool(pending))
        refresh = gr.Button("Refresh", size="sm", scale=1, elem_id="decode-refresh")
    note = gr.Markdown(NONE_SAVED if not pending else "", elem_id="decode-note")
    with gr.Row():
        tiled_btn = gr.Button("Decode again (tiled)", variant="primary", elem_id="decode-tiled",
                              interactive=bool(pending))
        cpu_btn = gr.Button("Decode again on the CPU", elem_id="decode-cpu", interactive=bool(pending))
    video = gr.Video(label="Decoded video", elem_id="decode-video", height=400)
    status = gr.Markdown(elem_id="decode-status", elem_classes=["wan-status"])

    def show(view, event) -> dict:
        updates = {status: view.markdown()}
        if isinstance(event, JobFinished):
            updates[video] = event.paths[0]
        return updates

    def prepare(latents, on_cpu: bool):
        def check():
            if not isinstance(latents, str) or latents not in {path for _, path in pending_latents(ctx.outputs_dir)}:
                raise InputError("pick saved latents from the list (only this app's outputs folder is used)")
            return EngineWork(lambda slots: ctx.client.decode(latents, tiled=not on_cpu, on_cpu=on_cpu, slots=slots))
        return check

    def decode_again(latents: str | None, session: gr.Request = None):
        yield from run_job(ctx, session, "decode again", prepare(latents, False), show)

    def decode_on_cpu(latents, session: gr.Request = None):
        yield from run_job(ctx, session, "decode again", prepare(latents, True), show)

    outputs = [choice, tiled_btn, cpu_btn, note]
    refresh.click(lambda: listing(ctx.outputs_dir), None, outputs, api_visibility="private")
    if tabs_select is not None:
        tabs_select(lambda: listing(ctx.outputs_dir), None, outputs, api_visibility="private", show_progress="hidden")
    tiled_btn.click(decode_again, choice, [video, status], api_name="decode_again", **gpu_event(ctx))
    cpu_btn.click(decode_on_cpu, choice, [video, status], api_visibility="private", **gpu_event(ctx))
