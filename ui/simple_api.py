"""The shortest API: a prompt and a step count in, an image out (POST {"data": [prompt, steps]})."""
from __future__ import annotations

import gradio as gr
from gradio.data_classes import FileData

from engine.events import JobFinished
from ui.context import AppContext
from ui.generate import GPU_QUEUE, build_request, engine_job, run_job


def build(ctx: AppContext) -> None:
    def generate_image(prompt: str, steps: int = 0, request: gr.Request = None) -> FileData:
        """A still from the default text-to-video preset's model and settings: `prompt` and `steps` (0: the
        preset's) in, the PNG out. Waits its turn in the same queue as the page's jobs."""
        # Everything not given is the default preset's (engine/settings/draft.py); no seed: a random one.
        given = {"preset": ctx.default_preset("t2v"), "prompt": prompt, "model": ctx.model_for("t2v")}
        given |= {} if steps in (0, None) else {"steps": steps}
        path = None
        for update in run_job(ctx, request, "text to image", engine_job(ctx, lambda: build_request(ctx, "t2i", given)),
                              lambda view, event: {"path": event.paths[0]} if isinstance(event, JobFinished) else {}):
            path = update.get("path", path)
        return FileData(path=path)

    gr.api(generate_image, api_name="generate_image", concurrency_id=GPU_QUEUE,
           concurrency_limit=ctx.jobs.max_waiting + 2)
