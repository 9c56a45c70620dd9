"""Decode again: saved latents of runs whose decode failed become a video without denoising again."""
from __future__ import annotations

from pathlib import Path

import gradio as gr

from engine.latents import SUFFIX, stem_of

from .context import AppContext
from .generate import stream


def pending_latents(outputs_dir: str) -> list[tuple[str, str]]:
    """(label, path) of saved latents whose run has no video or image yet, newest first."""
    found = []
    for path in Path(outputs_dir).glob(f"*/*{SUFFIX}"):
        stem = stem_of(path)
        if not (stem.with_suffix(".mp4").exists() or stem.with_suffix(".png").exists()):
            found.append((path.stat().st_mtime, f"{path.parent.name} / {stem.name}", str(path)))
    return [(label, path) for _, label, path in sorted(found, reverse=True)]


def build(ctx: AppContext) -> None:
    gr.Markdown("Runs whose VAE decode failed keep their denoised latents. Decode them again here, in tiles "
                "(less memory) or on the CPU (slow, no device memory), without repeating the denoising.")
    with gr.Row():
        choice = gr.Dropdown(choices=pending_latents(ctx.outputs_dir), label="Saved latents", scale=4,
                             elem_id="decode-latents", allow_custom_value=True)
        refresh = gr.Button("Refresh", size="sm", scale=1, elem_id="decode-refresh")
    with gr.Row():
        tiled_btn = gr.Button("Decode again (tiled)", variant="primary", elem_id="decode-tiled")
        cpu_btn = gr.Button("Decode again on the CPU", elem_id="decode-cpu")
    video = gr.Video(label="Decoded video", elem_id="decode-video")
    status = gr.Markdown(elem_id="decode-status")

    def decode_again(latents: str | None, on_cpu: bool = False, progress=gr.Progress()):
        if not latents or latents not in {path for _, path in pending_latents(ctx.outputs_dir)}:
            raise gr.Error("Pick saved latents from the list (only this app's outputs folder is used).")
        events = ctx.client.decode(latents, tiled=not on_cpu, on_cpu=on_cpu)
        for video_path, status_text, *_ in stream(ctx, events, progress):
            yield video_path, status_text

    def decode_on_cpu(latents, progress=gr.Progress()):
        yield from decode_again(latents, True, progress)

    refresh.click(lambda: gr.Dropdown(choices=pending_latents(ctx.outputs_dir)), None, choice,
                  api_visibility="private")
    tiled_btn.click(decode_again, choice, [video, status], api_name="decode_again", concurrency_id="gpu")
    cpu_btn.click(decode_on_cpu, choice, [video, status], api_visibility="private", concurrency_id="gpu")
