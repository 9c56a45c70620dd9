"""The LoRA box's list: "Add a LoRA" from the models folder's loras/, then a slider and a Remove button for each
LoRA line of the box. The box stays the one source of the LoRAs (the run, the plan, presets and Reuse settings
read and fill it): every control here rewrites its text, and the list is drawn again from it."""
from __future__ import annotations

from pathlib import Path

import gradio as gr

from engine.settings.loras import LORAS_FOLDER, listed_lora_files
from engine.settings.values import MAX_LORA_STRENGTH
from ui.views.lora_lines import LoraRow, lora_rows, typed_strength, with_lora, with_strength, without

STRENGTH_STEP = 0.05
ADD_INFO = f"a .safetensors file from models/{LORAS_FOLDER}/, added at strength 1"
# gradio's default minimum width (160 px) would leave the Remove and Refresh buttons wider than their words.
BUTTON_WIDTH = 90


def build_lora_list(box: gr.Textbox, models_dir: str | Path, prefix: str) -> None:
    """Under ``box``: the "Add a LoRA" dropdown with its Refresh button, and one row per LoRA line."""
    with gr.Row(elem_id=f"{prefix}-lora-adder"):
        add = gr.Dropdown([], value=None, label="Add a LoRA", info=ADD_INFO, elem_id=f"{prefix}-lora-add", scale=3)
        refresh = gr.Button("Refresh", size="sm", elem_id=f"{prefix}-lora-refresh", scale=0, min_width=BUTTON_WIDTH)

    def listed():
        return gr.Dropdown(choices=listed_lora_files(models_dir), value=None)

    def added(text, file):
        if not file:
            return gr.skip(), gr.skip()
        return with_lora(text, file), gr.Dropdown(value=None)

    # No trigger: when the page opens; then whenever Refresh is pressed.
    gr.on(None, listed, None, add, api_visibility="private", queue=False, show_progress="hidden")
    refresh.click(listed, None, add, api_visibility="private", queue=False, show_progress="hidden")
    add.input(added, [box, add], [box, add], api_visibility="private", queue=False, show_progress="hidden")

    # Drawn when the page opens and whenever the box changes (typed, a preset, Reuse settings, a row's edit).
    @gr.render(inputs=[box], queue=False, show_progress="hidden")
    def rows(text):
        seen: dict[tuple[str, str], int] = {}
        for number, row in enumerate(lora_rows(text)):
            # The same LoRA keeps its slider while the list is redrawn; its value always follows the box.
            which = (row.lora.file, row.lora.expert)
            seen[which] = seen.get(which, 0) + 1
            _row(box, row, number, f"{prefix}-lora-{row.lora.file}-{row.lora.expert}-{seen[which]}", prefix)


def _row(box: gr.Textbox, row: LoraRow, number: int, key: str, prefix: str) -> None:
    with gr.Row(key=f"{key}-row", elem_id=f"{prefix}-lora-row-{number}"):
        slider = gr.Slider(-MAX_LORA_STRENGTH, MAX_LORA_STRENGTH, step=STRENGTH_STEP,
                           value=max(-MAX_LORA_STRENGTH, min(MAX_LORA_STRENGTH, row.lora.strength)),
                           label=row.lora.shown, key=key, preserved_by_key=None, interactive=True, buttons=[],
                           elem_id=f"{prefix}-lora-slider-{number}", scale=4)
        remove = gr.Button("Remove", size="sm", variant="secondary", key=f"{key}-remove",
                           elem_id=f"{prefix}-lora-remove-{number}", scale=0, min_width=BUTTON_WIDTH)
    def strength_set(text, typed):
        strength, note = typed_strength(typed, MAX_LORA_STRENGTH)
        if note:
            gr.Warning(note)
        return gr.skip() if strength is None else with_strength(text, row, strength)

    # Raw values (preprocess=False): a strength typed past the ends reaches the handler, which says what it set,
    # instead of gradio's range check failing the request. Queued (in its own group), so that its warning shows.
    slider.release(strength_set, [box, slider], box, api_visibility="private", show_progress="hidden",
                   preprocess=False, concurrency_limit=None)
    remove.click(lambda text: without(text, row), box, box, api_visibility="private", queue=False,
                 show_progress="hidden")
