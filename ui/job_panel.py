"""The right-hand column of a generation tab: live preview, result, status, timings."""
from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from .job_view import TIMING_HEADERS


@dataclass
class JobPanel:
    preview: gr.HTML
    result: gr.components.Component      # gr.Video or gr.Image
    status: gr.Markdown
    seed_used: gr.Number
    chart: gr.HTML
    timings: gr.Dataframe

    def outputs(self, result: gr.components.Component | None = None) -> list:
        """Components in the order ui.generate.stream yields them."""
        return [result or self.result, self.status, self.timings, self.seed_used, self.preview, self.chart]

    def reveal_seed_after(self, *runs) -> None:
        """The seed box appears on the page once a run has finished (API callers get the plain number)."""
        for run in runs:
            run.success(lambda: gr.Number(visible=True), None, self.seed_used, queue=False,
                        api_visibility="private", show_progress="hidden")


def build_job_panel(prefix: str, video: bool = True, image: bool = False) -> tuple[JobPanel, gr.Image | None]:
    """Preview, result video (and a result image for the 1-frame mode), status, seed, chart, timing table."""
    preview = gr.HTML("", elem_id=f"{prefix}-preview", label="Live preview")
    result = gr.Video(label="Result video", elem_id=f"{prefix}-video", autoplay=True, loop=True)
    still = None
    if image:
        still = gr.Image(label="Result image", type="filepath", elem_id="t2i-image", interactive=False,
                         visible=False)
    status = gr.Markdown(elem_id=f"{prefix}-status")
    # Hidden until a run has finished: an empty number box would show 0.
    seed_used = gr.Number(value=None, label="Seed used", precision=0, interactive=False, visible=False,
                          elem_id=f"{prefix}-seed-used")
    with gr.Accordion("Where the time goes", open=True, elem_id=f"{prefix}-timing-panel"):
        chart = gr.HTML("", elem_id=f"{prefix}-timing-chart")
        timings = gr.Dataframe(headers=TIMING_HEADERS, label="Phase timings", interactive=False,
                               elem_id=f"{prefix}-timings", type="array")
    return JobPanel(preview, result, status, seed_used, chart, timings), still
