"""The shortest API: a prompt and a step count in, an image out (POST {"data": [prompt, steps]})."""
from __future__ import annotations

import gradio as gr
from gradio.data_classes import FileData

from .context import AppContext
from .generate import GPU_QUEUE, build_request, stream


def build(ctx: AppContext) -> None:
    def generate_image(prompt: str, steps: int = 0, request: gr.Request = None) -> FileData:
        """A still from the default text-to-video preset's model and settings: `prompt` and `steps` (0: the
        preset's) in, the PNG out. Runs in the same queue as the page's jobs."""
        preset = ctx.presets[ctx.default_preset("t2v")]
        job = build_request(ctx, "t2i", preset.name, prompt, preset.negative_prompt, ctx.model_for("t2v"),
                            preset.width, preset.height, 1, int(steps) or preset.steps, preset.guidance,
                            preset.shift, -1)
        path = None
        for output in stream(ctx, ctx.client.submit(job), lambda *args, **kwargs: None, request):
            if isinstance(output[0], str):
                path = output[0]
        return FileData(path=path)

    gr.api(generate_image, api_name="generate_image", concurrency_id=GPU_QUEUE)
