"""The right-hand column of a generation tab: live preview, result, status, timings; and how a job's view
becomes updates of it."""
from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from engine.events import Event, JobFinished, PreviewReady
from ui.parts.visibility import visible_if
from ui.views.job_view import TIMING_HEADERS, JobView


@dataclass
class JobPanel:
    preview: gr.HTML
    result: gr.Video
    still: gr.Image | None               # the 1-frame mode's result (Text to Video tab only)
    status: gr.Markdown
    seed_used: gr.Number
    chart: gr.HTML
    timings: gr.Dataframe
    cancel_answer: gr.Textbox            # what Cancel answered (hidden: the page shows it as a toast)
    made: gr.State                       # what the last job made: "video", "still" or None (not in the API)

    def outputs(self, result: gr.components.Component | None = None) -> list:
        """The components a generation event writes, in the order its API returns them (the state is not)."""
        return [result or self.result, self.status, self.timings, self.seed_used, self.preview, self.chart, self.made]

    def show(self, result: gr.components.Component | None = None):
        """``show(view, event)`` for ui.generate.run_job: the updates of this panel for one event.

        The result changes only when a new file exists, so an earlier output is never lost; a job that is
        refused or waits changes nothing but the status; the live preview goes when the job ends.
        """
        result = result or self.result
        kind = "still" if result is self.still else "video"

        def show(view: JobView, event: Event | None) -> dict:
            updates = {self.status: view.markdown(), self.made: None}
            if event is None:         # refused, waiting or taken out of the queue: the last job's figures stay
                return updates
            updates |= {self.timings: view.timing_rows(), self.chart: view.chart_html()}
            if isinstance(event, PreviewReady):
                updates[self.preview] = view.preview_html()
            if isinstance(event, JobFinished):
                updates |= {result: event.paths[0], self.seed_used: event.seed, self.made: kind}
            if view.ended:
                updates[self.preview] = ""
            return updates
        return show

    def reveal_after(self, *runs) -> None:
        """Once a run has made something, the seed box appears (API callers get the plain number), and the box
        of what was made is shown alone: a video replaces the still's box, a still the video's. A run that made
        nothing (cancelled, taken out of the queue) changes neither."""
        boxes = [self.seed_used, self.result, *([self.still] if self.still is not None else [])]

        def reveal(made):
            if made not in ("video", "still"):
                return [gr.skip()] * len(boxes)
            updates = [gr.Number(visible=True), gr.Video(visible=visible_if(made == "video"))]
            return updates + ([gr.Image(visible=visible_if(made == "still"))] if self.still is not None else [])

        for run in runs:
            run.success(reveal, self.made, boxes, queue=False, api_visibility="private", show_progress="hidden")


def build_job_panel(prefix: str, still: bool = False) -> JobPanel:
    """Preview, result video (and a result image for the 1-frame mode), status, seed, chart, timing table."""
    preview = gr.HTML("", elem_id=f"{prefix}-preview", label="Live preview")
    result = gr.Video(label="Result video", elem_id=f"{prefix}-video", autoplay=True, loop=True, height=400)
    image = None
    if still:
        image = gr.Image(label="Result image", type="filepath", elem_id="t2i-image", interactive=False,
                         visible=False, height=400)
    status = gr.Markdown(elem_id=f"{prefix}-status", elem_classes=["wan-status"])
    # Hidden until a run has finished: an empty number box would show 0.
    # It belongs to the result above it, which stays while a new run goes on (or fails): its label says so.
    seed_used = gr.Number(value=None, label="Seed of the result shown", precision=0, interactive=False,
                          visible=False, elem_id=f"{prefix}-seed-used")
    with gr.Accordion("Where the time goes", open=True, elem_id=f"{prefix}-timing-panel"):
        chart = gr.HTML("", elem_id=f"{prefix}-timing-chart")
        timings = gr.Dataframe(headers=TIMING_HEADERS, label="Phase timings", interactive=False,
                               elem_id=f"{prefix}-timings", type="array")
    answer = gr.Textbox(visible=False, elem_id=f"{prefix}-cancel-answer")
    return JobPanel(preview, result, image, status, seed_used, chart, timings, answer, gr.State(None))
