"""Two redraws of one page never run at once (ui/parts/render_lock.py): the second waits for the first."""
from __future__ import annotations

import threading

import gradio as gr
from gradio.context import LocalContext

from ui.parts.render_lock import one_render_at_a_time


def test_a_second_redraw_waits_until_the_first_is_drawn():
    one_render_at_a_time()
    one_render_at_a_time()   # twice: still one lock, not two wrappers
    inside, release = [], threading.Event()
    with gr.Blocks() as demo:
        box = gr.Textbox()

        @gr.render(inputs=box)
        def drawn(text):
            inside.append(text)
            if text == "first":
                release.wait(10)
            gr.Markdown(text)

    [renderable] = demo.default_config.renderables
    ended = []

    def redraw(text):
        LocalContext.blocks_config.set(demo.default_config)
        renderable.apply(text)
        ended.append(text)

    first = threading.Thread(target=redraw, args=("first",))
    first.start()
    while not inside:
        first.join(0.01)
    second = threading.Thread(target=redraw, args=("second",))
    second.start()
    second.join(0.5)
    assert inside == ["first"] and second.is_alive()   # waiting for the first redraw, not drawing beside it
    release.set()
    first.join(10)
    second.join(10)
    assert inside == ["first", "second"] and ended == ["first", "second"]
