"""The memory plan on the page: what the planner would do with the form's settings (pure; no gradio).

The page never probes the hardware itself: the caller passes the profile the
engine process reported (``WorkerClient.hardware_profile()``).
"""
from __future__ import annotations

from pathlib import Path

from engine.device.hardware import HardwareProfile
from engine.models.single_file import transformer_folder
from engine.planning.ahead import plan_settings
from engine.planning.planner import LADDER, TEXT_ENCODER_PLACES, Plan, strategy_words
from engine.planning.speed import ATTENTION_BACKENDS, VAE_DTYPES
from engine.models.loras import as_lora
from engine.settings.loras import lora_folder, lora_line, parse_lora_lines
from engine.settings.draft import prepare
from engine.settings.values import Settings
from engine.words import plural
from ui.context import AppContext
from ui.views.job_view import PHASE_LABELS
from ui.views.text import code, plain

AUTO = "Auto"
STRATEGY_CHOICES = (AUTO, *LADDER)
TEXT_ENCODER_CHOICES = (AUTO, *TEXT_ENCODER_PLACES)
VAE_TILING_CHOICES = (AUTO, "On", "Off")
OFF = "Off"
# The speed dropdowns: (label, value) pairs where the value is not the label.
DECODER_CHOICES = (("VAE (exact)", "vae"), ("Fast (approximate)", "fast"))
STEP_CACHE_CHOICES = ((OFF, OFF), ("First block (approximate)", "first_block"), ("MagCache (approximate)", "mag"),
                      ("TaylorSeer (approximate)", "taylor"))
COMPILE_CHOICES = (AUTO, "On", "Off")
ATTENTION_CHOICES = (AUTO, *ATTENTION_BACKENDS)
VAE_PRECISION_CHOICES = (AUTO, *VAE_DTYPES)
# The GPUs dropdown (shown on a machine with more than one): Auto, or how many GPUs split the job's denoise.
MAX_GPU_CHOICES = 8


def gpu_choices(count: int) -> list[str]:
    """The GPUs dropdown's choices on a machine of ``count`` GPUs: Auto, then 1 to ``count`` (at most 8)."""
    return [AUTO, *(str(n) for n in range(1, min(count, MAX_GPU_CHOICES) + 1))]


# The transformer file dropdowns' first choice: no file, the model's own transformer.
OWN_TRANSFORMER = "(the model's own)"
# Where a component can live, in the order the phase table lists them.
PLACES = ("device", "streamed", "cpu", "absent")


def override_fields(strategy: str | None = AUTO, text_encoder: str | None = AUTO, vae_tiling: str | None = AUTO,
                    decoder: str | None = "vae", step_cache: str | None = OFF, compile: str | None = AUTO,
                    attention: str | None = AUTO, vae_precision: str | None = AUTO, loras: str | None = "",
                    transformer=OWN_TRANSFORMER, transformer_2=OWN_TRANSFORMER, gpus=AUTO) -> dict:
    """The plan dropdowns as Settings fields; Auto, Off (or nothing) leaves each choice to the planner. ``loras``:
    the LoRA box's text, one ``file: strength`` a line, as written (form_overrides finds the files); InputError
    when a line does not read. ``transformer`` and ``transformer_2``: the transformer file dropdowns, as sent
    (form_overrides finds and checks the files); their first choice is the model's own (None). ``gpus``: Auto
    (0) or a number of GPUs to split the job across."""
    def own_or_file(value):
        return None if value in (None, "", OWN_TRANSFORMER) else value

    def chosen(value):
        return None if value in (None, "", AUTO) else value

    def count(value):
        # A number as the dropdown sends it ("2"); anything else stays as it came, for the check to refuse.
        value = chosen(value)
        return 0 if value is None else int(value) if isinstance(value, str) and value.isdigit() else value

    def on_off(value):
        # Anything but On or Off stays as it came, for the request's check to refuse with its own message.
        value = chosen(value)
        return {"On": True, "Off": False}.get(value, value) if isinstance(value, str) else value

    return {"strategy": chosen(strategy), "text_encoder": chosen(text_encoder), "vae_tiling": on_off(vae_tiling),
            "decoder": decoder or "vae", "step_cache": None if step_cache in (None, "", OFF) else step_cache,
            "compile": on_off(compile), "attention": chosen(attention), "vae_dtype": chosen(vae_precision),
            "loras": parse_lora_lines(loras), "transformer": own_or_file(transformer),
            "transformer_2": own_or_file(transformer_2), "gpus": count(gpus)}


def form_overrides(ctx: AppContext, *choices) -> dict:
    """override_fields with each LoRA file's path (a name is looked for in the models folder's loras/) and each
    transformer file's (a name is a file in its transformers/); InputError for a file the page may not use."""
    fields = override_fields(*choices)
    files = ctx.transformer_files({name: fields[name] for name in ("transformer", "transformer_2")})
    return {**fields, "loras": ctx.lora_files(fields["loras"]), **files}


def transformer_choice(path: str | None, models_dir) -> str:
    """A Settings' transformer file as its dropdown shows it: a file in models/transformers/ by its name there,
    another by its path, none as the model's own."""
    if not path:
        return OWN_TRANSFORMER
    folder, where = transformer_folder(models_dir).resolve(), Path(path).resolve()
    return where.relative_to(folder).as_posix() if folder in where.parents else path


def lora_text(loras, models_dir) -> str:
    """Settings' LoRAs as the LoRA box shows them: one ``file: strength`` a line, a file in models/loras/ by name."""
    folder = lora_folder(models_dir).resolve()
    lines = []
    for lora in map(as_lora, loras):
        path = Path(lora.file).resolve()
        lines.append(lora_line(lora, path.relative_to(folder).as_posix() if folder in path.parents else lora.file))
    return "\n".join(lines)


def plan_markdown(plan: Plan) -> str:
    """Headline, peaks against budgets, a table of phases, the reasons and (when it does not fit) what to change."""
    verdict = "fits" if plan.fits else "does NOT fit"
    cpu = plan.device == "cpu"   # no device memory to show
    name, what = strategy_words(plan.strategy, plan.device)
    lines = [f"**Strategy: {name}** ({verdict}): {what}.",
             "", _peaks(plan), "", _settings(plan), "", *_split_lines(plan),
             "| Phase |" + ("" if cpu else " Device GB |") + " RAM GB | Where the components live |",
             "|---|" + ("" if cpu else "--:|") + "--:|---|"]
    for phase in plan.phases:
        device = "" if cpu else f" {phase.peak_vram_gb:.2f} |"
        lines.append(f"| {PHASE_LABELS.get(phase.phase, phase.phase)} |{device} {phase.peak_ram_gb:.2f} | "
                     f"{_where(phase.placement)} |")
    if plan.decisions:
        lines += ["", "**Why**", *(f"- {sentence}" for sentence in plan.decisions)]
    if not plan.fits and plan.suggestions:
        lines += ["", "**To make it fit**", *(f"- {tip}" for tip in plan.suggestions)]
    return "\n".join(lines)


def _peaks(plan: Plan) -> str:
    ram = f"{plan.predicted_peak_ram_gb:.2f} of {plan.budget_ram_gb:.2f} GB RAM"
    if plan.device == "cpu":
        return f"Predicted peak: {ram} (CPU only)."
    return (f"Predicted peak: {plan.predicted_peak_vram_gb:.2f} of {plan.budget_vram_gb:.2f} GB device memory, "
            f"{ram}.")


def _settings(plan: Plan) -> str:
    tiles = f"in {plan.vae_tile}px tiles" if plan.vae_tiled else "whole (untiled)"
    if plan.device == "cpu":
        return f"Computes in {plan.dtype} on the CPU; the VAE decodes {tiles}."
    fp8 = ", transformer weights in fp8" if plan.fp8 else ""
    compiled = "transformer compiled" if plan.compile else "transformer not compiled"
    return (f"Computes in {plan.dtype}{fp8}; text encoder: {plan.text_encoder}; "
            f"VAE ({plan.vae_dtype}) decodes {tiles}; {compiled}; attention: {plan.attention_backend}.")


def _split_lines(plan: Plan) -> list[str]:
    """How the job uses several GPUs (nothing for one): per GPU, the peaks above hold the whole model and its
    share of the activations."""
    if plan.split is None:
        return []
    if not plan.split.possible:
        return [f"**GPUs: {plan.split.ranks}, cannot split**: {plan.split.reason}.", ""]
    return [f"**GPUs: {plan.split.ranks}** (context parallel, {plan.split.kind}); the peaks are each GPU's.", ""]


def _where(placement: dict) -> str:
    """'device: vae; streamed: transformer' from {component: place}."""
    groups = []
    for place in (*PLACES, *sorted(set(placement.values()) - set(PLACES))):
        names = [name.replace("_", " ") for name, where in placement.items() if where == place]
        if names:
            groups.append(f"{place}: {', '.join(names)}")
    return "; ".join(groups)


def form_plan_markdown(ctx: AppContext, hardware: HardwareProfile, mode: str, preset: str | None,
                       model: str | None, width, height, frames, *choices) -> str:
    """The plan for a generation tab's current values (``choices``: the plan dropdowns' values, in
    override_fields' order), or one line saying why there is none."""
    try:
        settings = _form_settings(ctx, mode, preset, model, width, height, frames, form_overrides(ctx, *choices))
        plan = plan_settings(settings, hardware, ctx.client.catalog, ctx.client.engine_count())
    except ValueError as exc:   # InputError, ModelError and a bad override are all ValueErrors
        problems = getattr(exc, "problems", ())
        if len(problems) > 1:
            return "**No plan yet:**\n" + "\n".join(f"- {plain(problem)}" for problem in problems)
        return f"**No plan yet:** {plain(exc)}"
    kind = "image to video" if mode == "i2v" else "video"
    subject = (f"_For {code(settings.model)}, {kind} {settings.width}x{settings.height}, "
               f"{plural(settings.frames, 'frame')}, on {hardware.summary()}._")
    return subject + "\n\n" + time_line(ctx, settings, plan, hardware) + plan_markdown(plan)


def time_line(ctx: AppContext, settings: Settings, plan: Plan, hardware: HardwareProfile) -> str:
    """'**About 41 s**' for these settings, from this machine's measured rates (none before they are measured:
    the first run measures them)."""
    from engine.device.calibrate import Calibration
    from engine.planning.timing import predict_times

    calibration = Calibration.load(Path(ctx.outputs_dir), hardware)
    if calibration is None or not plan.fits:
        return ""
    spec = ctx.client.catalog.settings_spec(settings)
    first, loaded = (predict_times(spec, settings.width, settings.height, settings.frames, settings.steps,
                                   settings.guidance, plan, calibration, settings.decoder,
                                   image_to_video=settings.mode == "i2v", loaded=state) for state in (False, True))
    return (f"**About {_secs(first.total)}** to make this video ({_secs(loaded.total)} when the model is already "
            f"loaded; denoising {_secs(first.seconds.get('denoise', 0))}, decoding "
            f"{_secs(first.seconds.get('vae_decode', 0))}), predicted from this machine's measured speed.\n\n")


def _secs(seconds: float) -> str:
    """'41 s', '2.4 s', '0.3 s': whole seconds from ten on."""
    return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"


def _form_settings(ctx: AppContext, mode: str, preset_name: str | None, model: str | None, width, height,
                   frames, overrides: dict) -> Settings:
    """The preset's settings with the form's model, size and memory choices, made and checked as Generate makes
    them (engine/settings/draft.py: an empty box is missing there too)."""
    preset = ctx.preset_or_default(preset_name, mode)
    values = dict(model=model, width=width, height=height, frames=frames, **overrides)
    return prepare(values, preset.settings, mode, ctx.model_ref, ctx.client.catalog.limits)
