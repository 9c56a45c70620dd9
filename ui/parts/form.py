"""The settings form shared by the generation tabs, and its memory-plan panel."""
from __future__ import annotations

from dataclasses import dataclass, field

import gradio as gr

from engine.models.limits import Limits
from engine.models.single_file import TRANSFORMERS, TRANSFORMERS_FOLDER, listed_transformer_files
from engine.settings.presets import Preset
from engine.models.limits import MAX_WINDOW_FRAMES
from engine.settings.values import MAX_COUNT, MAX_FRAMES, MAX_SIDE, MAX_STEPS, MIN_SIDE, Settings
from ui.context import AppContext
from ui.parts.lora_list import build_lora_list
from ui.parts.visibility import HIDDEN, visible_if
from engine.settings.fields import AUTO, FIELD, FIELDS, OWN_TRANSFORMER, Place, api_fields, by_field, on_page, plan_fields
from ui.views.plan_panel import form_plan_markdown, gpu_choices, lora_text, transformer_choice

CPU_NOTE = ("On a CPU-only machine every weight stays in RAM: there is no strategy or text-encoder place to choose, "
            "nothing to compile, no other attention to pick and no float8 maths. VAE tiling still lowers the decode's "
            "memory.")
# Width, height, frames and steps share one row of a half-width column (gradio's default minimum is 160 px).
NUMBER_MIN_WIDTH = 100
# Under the negative prompt box: the presets' suggestion is the models' official one, in Chinese.
NEGATIVE_INFO = ("what to steer away from; a preset with guidance suggests Wan's official one, in Chinese as the models "
                 "were trained with it (the README gives it in English). Your own text, in any language, replaces it.")
# Under the window boxes: what they do, and when.
WINDOW_INFO = "a video with more frames is made in overlapping windows of this many, blended (0: {own})"
OVERLAP_INFO = "the frames neighbouring windows share at least (a multiple of 4)"
COUNT_INFO = "made one after the other, seeds seed, seed+1, ... (each random with -1)"
SMOOTHER_INFO = "frames made between the video's once it is written: 16 fps becomes 32 or 64 (RIFE or ffmpeg)"
LARGER_INFO = "the frames upscaled once written (an upscaler in models/upscalers/, else Lanczos)"
STRENGTH_INFO = ("how much is made anew: 0 gives the input back, 1 a new video from the prompt; the denoise runs this "
                 "part of the steps")
# The settings the form shows, by their Settings names (the memory choices are the plan panel's).
FORM_SETTINGS = tuple(field.name for field in on_page(Place.FORM))
# The low-noise expert's guidance box (Wan2.2 A14B's second expert; 0 or empty: the same as Guidance; left out for
# models with one transformer).
LOW_NOISE_GUIDANCE = FIELD["guidance_2"].label


@dataclass
class Form:
    preset: gr.Dropdown
    prompt: gr.Textbox
    negative_prompt: gr.Textbox
    model: gr.Textbox
    width: gr.Number
    height: gr.Number
    frames: gr.Number
    steps: gr.Number
    guidance: gr.Number
    shift: gr.Number
    seed: gr.Number
    # The Image to Video tab's first and last frame (None on the Text to Video tab).
    image: gr.Image | None = None
    last_image: gr.Image | None = None
    # The video a run starts from: the Image to Video tab's video to extend, the Video to Video tab's input.
    extend: gr.Video | None = None
    extend_box: gr.Accordion | None = None     # the Image to Video tab's accordion that holds it
    video: gr.Video | None = None
    # Video to Video: how much of the input is made anew.
    strength: gr.Slider | None = None
    # The plan panel's LoRA box, once it is built (Reuse settings and Save as preset carry the LoRAs through it).
    loras: gr.Textbox | None = None
    # Wan2.2 A14B's low-noise expert's guidance (0: the same as Guidance); sent after the plan's choices.
    guidance_2: gr.Number | None = None
    # A long video's windows: their frames (0: the model's own) and the frames neighbours share; sent last.
    window: gr.Number | None = None
    overlap: gr.Number | None = None
    # How many videos (or stills) one Generate makes, one after the other.
    count: gr.Number | None = None
    # After the video is written: smoother (frames between) and larger (upscaled), each off, 2x or 4x.
    interpolate: gr.Dropdown | None = None
    upscale: gr.Dropdown | None = None
    # The plan panel's boxes by field name, once it is built.
    plan: dict = field(default_factory=dict)
    # The tab's job status (Reuse settings says there what it filled in, in place of an earlier job's words).
    status: gr.Markdown | None = None

    def boxes(self) -> dict:
        """Every box of the form by field name (engine/settings/fields.py), the plan panel's included."""
        own = {f.name: getattr(self, f.name) for f in FIELDS if getattr(self, f.name, None) is not None}
        return {**own, **self.plan}

    def api_inputs(self, mode: str) -> dict:
        """{API parameter name: box} of a generation endpoint of ``mode``, in the API's order (the field table's)."""
        boxes = self.boxes()
        return {f.api_name: boxes[f.name] for f in api_fields(mode)}

    def preset_fields(self) -> list:
        """What choosing a preset fills: the settings boxes, then the negative prompt (preset_values' order)."""
        return [*(getattr(self, name) for name in FORM_SETTINGS), self.negative_prompt]

    def settings_updates(self, settings: Settings, keep=()) -> dict:
        """{box: value} putting ``settings`` into the form; the names in ``keep`` are left as they are."""
        return {getattr(self, name): shown(settings, name) for name in FORM_SETTINGS if name not in keep}


def preset_values(preset: Preset) -> list:
    """A preset's values for Form.preset_fields()."""
    return [*(shown(preset.settings, name) for name in FORM_SETTINGS), preset.negative_prompt]


def shown(settings: Settings, name: str):
    """A setting as its box shows it: no low-noise guidance as 0 (the same as Guidance), as the box starts."""
    value = getattr(settings, name)
    return 0 if name == "guidance_2" and value is None else value


@dataclass
class PlanPanel:
    boxes: dict      # the plan's dropdowns, the LoRA box (one "file: strength" a line) and the transformer files
    plan: gr.Markdown


def preset_choices(ctx: AppContext, mode: str) -> list[tuple[str, str]]:
    """(title, name) of every preset of the mode, built-in and the user's own, for the Preset dropdown."""
    presets = dict(ctx.presets)   # a snapshot: a user preset may be saved or deleted meanwhile
    return [(presets[name].title, name) for name in ctx.presets_for(mode) if name in presets]


def frames_label(hint: str) -> str:
    return f"Frames ({hint})"


def form_limits(ctx: AppContext, mode: str, preset: str | None, model: str | None) -> Limits | None:
    """What the model in the form can make (its frame and size limits), or None when it is not known yet."""
    try:
        ref = ctx.model_ref(model or ctx.preset_or_default(preset, mode).settings.model)
    except ValueError:   # a refused model: the run (and the plan) say why
        return None
    return ctx.client.catalog.limits(ref)


def limit_updates(limits: Limits | None) -> tuple:
    """The form's frames, width and height boxes with the model's maxima and the frames hint; its low-noise
    guidance shown only for a model with a low-noise expert (or one not known yet)."""
    frames = limits.max_frames if limits else MAX_FRAMES
    side = limits.max_side if limits else MAX_SIDE
    hint = limits.frames_hint if limits else f"4k+1, at most {MAX_FRAMES}"
    window = (gr.Number(maximum=limits.max_window, info=window_info(limits.window)) if limits
              else gr.Number(maximum=MAX_WINDOW_FRAMES, info=window_info(None)))
    return (gr.Number(maximum=frames, label=frames_label(hint)), gr.Number(maximum=side), gr.Number(maximum=side),
            gr.Number(visible=visible_if(has_low_noise_expert(limits))), window)


def window_info(own: int | None) -> str:
    """Under the window box: what it does, with the model's own window when it is known."""
    return WINDOW_INFO.format(own=f"the model's own, {own} frames" if own else "the model's own, 81 for most")


def has_low_noise_expert(limits: Limits | None) -> bool:
    """Whether the form shows the low-noise expert's fields: for Wan2.2 A14B, and while the model is not known."""
    return limits is None or limits.experts > 1


def build_form(ctx: AppContext, mode: str, prefix: str, actions=lambda: None):
    """(the settings form, what ``actions()`` returned): preset and prompt first, then ``actions()`` builds the
    tab's buttons (so that Generate is in sight without scrolling), then the model, negative prompt and
    numbers."""
    chosen = ctx.default_preset(mode)
    preset = ctx.presets[chosen]
    model = ctx.model_for(mode)
    preset_box = gr.Dropdown(choices=preset_choices(ctx, mode), value=chosen, label="Preset",
                             elem_id=f"{prefix}-preset")
    prompt = gr.Textbox(label="Prompt", lines=3, placeholder="Describe the video...", elem_id=f"{prefix}-prompt")
    # Video to Video's own setting, beside its prompt: how much of the input is made anew.
    strength = gr.Slider(0.0, 1.0, value=FIELD["strength"].start, step=0.05, label=FIELD["strength"].label,
                         info=STRENGTH_INFO, elem_id=f"{prefix}-strength") if mode == "v2v" else None
    if strength is not None:
        _say_typed_strength(strength)
    built = actions()
    with gr.Accordion("Settings", open=True, elem_id=f"{prefix}-settings"):
        model_box = gr.Textbox(value=model, label="Model (repo id, folder in models/, or selftest-t2v / selftest-i2v)",
                               elem_id=f"{prefix}-model")
        negative = gr.Textbox(value=preset.negative_prompt, label="Negative prompt", lines=2,
                              info=NEGATIVE_INFO, elem_id=f"{prefix}-negative")
        with gr.Row():
            width = gr.Number(value=preset.settings.width, label="Width", precision=0, minimum=MIN_SIDE, maximum=MAX_SIDE,
                              step=16, elem_id=f"{prefix}-width", min_width=NUMBER_MIN_WIDTH)
            height = gr.Number(value=preset.settings.height, label="Height", precision=0, minimum=MIN_SIDE, maximum=MAX_SIDE,
                               step=16, elem_id=f"{prefix}-height", min_width=NUMBER_MIN_WIDTH)
            frames = gr.Number(value=preset.settings.frames, label=frames_label(f"4k+1, at most {MAX_FRAMES}"), precision=0,
                               minimum=1, maximum=MAX_FRAMES, step=4, elem_id=f"{prefix}-frames",
                               min_width=NUMBER_MIN_WIDTH, scale=2)
        with gr.Row():
            steps = gr.Number(value=preset.settings.steps, label="Steps", precision=0, minimum=1, maximum=MAX_STEPS,
                              elem_id=f"{prefix}-steps", min_width=NUMBER_MIN_WIDTH)
            guidance = gr.Number(value=preset.settings.guidance, label="Guidance", step=0.5, elem_id=f"{prefix}-guidance",
                                 min_width=NUMBER_MIN_WIDTH)
            guidance_2 = gr.Number(value=shown(preset.settings, "guidance_2"), label=LOW_NOISE_GUIDANCE, step=0.5,
                                   elem_id=f"{prefix}-guidance-2", min_width=NUMBER_MIN_WIDTH)
            shift = gr.Number(value=preset.settings.shift, label="Shift", step=0.5, elem_id=f"{prefix}-shift",
                              min_width=NUMBER_MIN_WIDTH)
            seed = gr.Number(value=-1, label="Seed (-1 = random)", precision=0, elem_id=f"{prefix}-seed",
                             min_width=NUMBER_MIN_WIDTH, scale=2)
        window, overlap, count = _window_row(preset.settings, prefix)
        interpolate, upscale = _after_row(preset.settings, prefix, mode)
    form = Form(preset_box, prompt, negative, model_box, width, height, frames, steps, guidance, shift, seed,
                guidance_2=guidance_2, window=window, overlap=overlap, count=count, interpolate=interpolate,
                upscale=upscale, strength=strength)
    # preset_or_default: a user preset may have been deleted since the page loaded.
    # Only a person's choice fills the form: a preset set by code (history's Reuse, a saved preset)
    # comes with its own values.
    preset_box.input(lambda name: preset_values(ctx.preset_or_default(name, mode)), preset_box, form.preset_fields(),
                     api_visibility="private")
    if not ctx.default_model:   # no --model: the tab starts on the best preset that fits this machine
        _open_on_a_fitting_preset(ctx, mode, chosen, form)
    # The model's own limits (frames, size) follow the model in the form: when the page opens and when it changes.
    gr.on(None, lambda preset, model: limit_updates(form_limits(ctx, mode, preset, model)),
          [preset_box, model_box], [frames, width, height, guidance_2, window], api_visibility="private",
          show_progress="hidden",
          trigger_mode="always_last", queue=False, preprocess=False)
    return form, built


def _say_typed_strength(strength: gr.Slider) -> None:
    """A strength typed past the slider's ends is set to the nearest end by the page: said, with the same sentence
    the API and the command line refuse it with (the raw value reaches the handler: preprocess=False)."""
    from engine.settings.values import check_strength
    from engine.words import sentence

    def typed(value):
        problems: list[str] = []
        number = check_strength(value, problems)
        if problems:
            nearest = "" if number is None else f" The page set it to {min(1.0, max(0.0, number)):g}."
            gr.Warning(sentence(problems[0]) + nearest, title="Strength")

    strength.release(typed, strength, None, api_visibility="private", show_progress="hidden", preprocess=False,
                     concurrency_limit=None)


def _open_on_a_fitting_preset(ctx: AppContext, mode: str, chosen: str, form: Form) -> None:
    """When the page opens: the tab's preset switched to the first one whose plan fits this machine."""
    def fitting():
        try:
            name = ctx.fitting_preset(mode, ctx.client.hardware_profile())
        except OSError:   # the engine did not say what it runs on: the first preset stays
            name = chosen
        if name == chosen or name not in ctx.presets:
            return [gr.skip()] * (1 + len(form.preset_fields()))
        return [gr.Dropdown(value=name), *preset_values(ctx.presets[name])]

    gr.on(None, fitting, None, [form.preset, *form.preset_fields()], api_visibility="private",
          show_progress="hidden")


def _window_row(settings: Settings, prefix: str) -> tuple[gr.Number, gr.Number, gr.Number]:
    """The window and overlap boxes of a long video (more frames than the model's window), and how many."""
    with gr.Row():
        window = gr.Number(value=settings.window, label=FIELD["window"].label, precision=0, minimum=0,
                           maximum=MAX_WINDOW_FRAMES, step=4, elem_id=f"{prefix}-window", min_width=NUMBER_MIN_WIDTH,
                           info=window_info(None))
        overlap = gr.Number(value=settings.overlap, label=FIELD["overlap"].label, precision=0, minimum=4, step=4,
                            elem_id=f"{prefix}-overlap", min_width=NUMBER_MIN_WIDTH, info=OVERLAP_INFO)
        count = gr.Number(value=settings.count, label=FIELD["count"].label, precision=0, minimum=1,
                          maximum=MAX_COUNT, elem_id=f"{prefix}-count", min_width=NUMBER_MIN_WIDTH, info=COUNT_INFO)
    return window, overlap, count


def _after_row(settings: Settings, prefix: str, mode: str) -> tuple[gr.Dropdown, gr.Dropdown]:
    """Smoother and Larger: the steps after the video is written (engine/post/), each off, 2x or 4x."""
    with gr.Row():
        interpolate = gr.Dropdown(choices=list(FIELD["interpolate"].shown), value=settings.interpolate,
                                  label=FIELD["interpolate"].label, elem_id=f"{prefix}-interpolate",
                                  info=SMOOTHER_INFO, visible=mode != "t2i")
        upscale = gr.Dropdown(choices=list(FIELD["upscale"].shown), value=settings.upscale,
                              label=FIELD["upscale"].label, elem_id=f"{prefix}-upscale", info=LARGER_INFO)
    return interpolate, upscale


def _dropdown(name: str, prefix: str, **layout) -> gr.Dropdown:
    """The plan panel's dropdown of the field ``name``: its choices, label and start from the field table."""
    field_ = FIELD[name]
    return gr.Dropdown(list(field_.shown), value=field_.start, label=field_.label,
                       elem_id=f"{prefix}-{name.replace('_', '-')}", **layout)


def build_plan_panel(ctx: AppContext, form: Form, mode: str, prefix: str,
                     api_name: str | None = None) -> PlanPanel:
    """The memory plan for the form's settings, with overrides; ``api_name`` makes it a public endpoint."""
    with gr.Accordion("Memory plan", open=True, elem_id=f"{prefix}-plan-panel"):
        with gr.Row():
            boxes = {"strategy": _dropdown("strategy", prefix, scale=2),
                     "text_encoder": _dropdown("text_encoder", prefix, scale=1),
                     "vae_tiling": _dropdown("vae_tiling", prefix, scale=1),
                     "gpus": gr.Dropdown([AUTO], value=AUTO, label=FIELD["gpus"].label, visible=False,
                                         elem_id=f"{prefix}-gpus", scale=1, info="split the job's denoise across "
                                         "GPUs (Auto: one unless it fits only split)")}
        cpu_note = gr.Markdown(CPU_NOTE, visible=False, elem_id=f"{prefix}-plan-cpu-note")
        boxes |= _speed_row(prefix)
        boxes["loras"] = _lora_box(ctx, form, mode, prefix)
        boxes |= _transformer_row(ctx, form, mode, prefix)
        plan = gr.Markdown("Working out the memory plan...", elem_id=f"{prefix}-plan")
    form.plan = {f.name: boxes[f.name] for f in on_page(Place.PLAN)}
    panel = PlanPanel(form.plan, plan)

    def for_this_machine():
        """On a CPU-only engine, Strategy, Text encoder, Compile, Attention and Linears mean nothing: they are hidden,
        and the note says why. GPUs shows only when the app runs several engines (one per GPU), offering as many."""
        try:
            hardware = ctx.client.hardware_profile()
        except (EOFError, OSError):
            return (gr.skip(),) * (len(hidden_on_cpu) + 2)
        cpu, count = hardware.backend == "cpu", ctx.client.engine_count()
        return (*(gr.Dropdown(visible=visible_if(not cpu)) for _ in hidden_on_cpu),
                gr.Markdown(visible=visible_if(cpu)),
                gr.Dropdown(choices=gpu_choices(count), visible=visible_if(count > 1)))

    hidden_on_cpu = [boxes[name] for name in ("strategy", "text_encoder", "compile", "attention", "compute")]
    gr.on(None, for_this_machine, None, [*hidden_on_cpu, cpu_note, boxes["gpus"]],
          api_visibility="private", show_progress="hidden")

    def show_plan(**values):
        """The memory plan for these settings on the engine's hardware, as markdown."""
        try:
            hardware = ctx.client.hardware_profile()
        except (EOFError, OSError) as exc:
            return f"**No plan yet:** the engine process did not answer ({exc}); try again in a moment."
        return form_plan_markdown(ctx, hardware, mode, by_field(values))

    # No triggers: runs on page load and whenever an input changes (a preset filling the form included).
    every = form.boxes()
    inputs = {f.api_name: every[f.name] for f in plan_fields()}
    if form.strength is not None:   # video to video: the steps it runs, so the time it takes
        inputs["strength"] = form.strength
    if form.extend is not None:     # an extension: its join after the video it continues
        inputs["extend"] = form.extend
    # The values as typed (preprocess=False): a number out of range gets the plan's own sentence, not an error.
    gr.on(None, show_plan, inputs_kwargs=inputs, outputs=plan, api_name=api_name,
          api_visibility="public" if api_name else "private", concurrency_id="plan", trigger_mode="always_last",
          show_progress="hidden", preprocess=False)
    return panel


def _lora_box(ctx: AppContext, form: Form, mode: str, prefix: str) -> gr.Textbox:
    """The run's LoRAs, one ``file: strength`` a line: the preset's when one is chosen (none for the built-in
    ones); a bare name is a file in the models folder's loras/. Under it, the list that adds, weighs and removes
    lines (ui/parts/lora_list.py)."""
    models = ctx.models_dir or ctx.client.models_dir
    box = gr.Textbox(lora_text(ctx.preset_or_default(None, mode).settings.loras, models), lines=2, max_lines=8,
                     label="LoRAs: one 'file: strength' a line (files in models/loras/; strength 1 as trained, "
                           "0 off)", placeholder="detail.safetensors: 0.8", elem_id=f"{prefix}-loras")
    form.preset.input(lambda name: lora_text(ctx.preset_or_default(name, mode).settings.loras, models), form.preset,
                      box, api_visibility="private", queue=False)
    build_lora_list(box, models, prefix)
    form.loras = box
    return box


TRANSFORMER_INFO = (f"a .gguf or .safetensors file from models/{TRANSFORMERS_FOLDER}/ in place of the model's own "
                    "(a GGUF one takes less memory)")
LOW_NOISE_INFO = "Wan2.2 A14B only: its low-noise expert (transformer_2)"


def transformer_choices(ctx: AppContext, *current: str) -> list[str]:
    """The transformer dropdowns' choices: the model's own, then the files in models/transformers/ (and the
    ``current`` values, a preset's file elsewhere, so that it shows among them)."""
    files = listed_transformer_files(ctx.models_dir or ctx.client.models_dir)
    return [OWN_TRANSFORMER, *files, *sorted({value for value in current if value and value != OWN_TRANSFORMER}
                                             - set(files))]


def _transformer_row(ctx: AppContext, form: Form, mode: str, prefix: str) -> dict:
    """Two dropdowns, the transformer file and the low-noise one, listing models/transformers/ when the page
    opens and when Refresh is pressed; the preset's files when one is chosen (none for the built-in ones)."""
    models = ctx.models_dir or ctx.client.models_dir

    def of_preset(name):
        settings = ctx.preset_or_default(name, mode).settings
        return [transformer_choice(getattr(settings, expert, None), models) for expert in TRANSFORMERS]

    first = of_preset(None)
    with gr.Row(elem_id=f"{prefix}-transformer-files"):
        boxes = [gr.Dropdown(transformer_choices(ctx, *first), value=value, label=label, info=info,
                             allow_custom_value=True, elem_id=f"{prefix}-{elem}", scale=3)
                 for value, label, info, elem in zip(first, ("Transformer file", "Low-noise transformer file"),
                                                     (TRANSFORMER_INFO, LOW_NOISE_INFO),
                                                     ("transformer-file", "transformer-2-file"))]
        refresh = gr.Button("Refresh", size="sm", elem_id=f"{prefix}-transformer-refresh", scale=0,
                            min_width=NUMBER_MIN_WIDTH)

    def listed():
        choices = transformer_choices(ctx)
        return [gr.Dropdown(choices=choices) for _ in boxes]

    # No trigger and no inputs: when the page opens; then whenever Refresh is pressed.
    gr.on(None, listed, None, boxes, api_visibility="private", queue=False, show_progress="hidden")
    refresh.click(listed, None, boxes, api_visibility="private", queue=False, show_progress="hidden")
    form.preset.input(of_preset, form.preset, boxes, api_visibility="private", queue=False)

    def low_noise(preset, model):   # hidden, and back to the model's own, for a model with one transformer
        expert = has_low_noise_expert(form_limits(ctx, mode, preset, model))
        return gr.Dropdown(visible=True) if expert else gr.Dropdown(visible=HIDDEN, value=OWN_TRANSFORMER)

    gr.on(None, low_noise, [form.preset, form.model], boxes[1], api_visibility="private", show_progress="hidden",
          trigger_mode="always_last", queue=False)
    return dict(zip(TRANSFORMERS, boxes))


def _speed_row(prefix: str) -> dict:
    """The speed choices in two rows: what the picture is made with (the exact defaults first; the approximate ones
    say so in their names), then how the plan runs it."""
    with gr.Row(elem_id=f"{prefix}-speed"):
        boxes = {"decoder": _dropdown("decoder", prefix, min_width=NUMBER_MIN_WIDTH, scale=2),
                 "step_cache": _dropdown("step_cache", prefix, min_width=NUMBER_MIN_WIDTH, scale=2),
                 "compute": _dropdown("compute", prefix, min_width=NUMBER_MIN_WIDTH, scale=2)}
    with gr.Row(elem_id=f"{prefix}-speed-run"):
        return boxes | {
            "compile": _dropdown("compile", prefix, min_width=NUMBER_MIN_WIDTH),
            "guidance_batch": _dropdown("guidance_batch", prefix, min_width=NUMBER_MIN_WIDTH),
            "attention": _dropdown("attention", prefix, min_width=NUMBER_MIN_WIDTH),
            "vae_dtype": gr.Dropdown(list(FIELD["vae_dtype"].shown), value=AUTO, label=FIELD["vae_dtype"].label,
                                     elem_id=f"{prefix}-vae-precision", min_width=NUMBER_MIN_WIDTH)}
