"""The memory plan on the page: what the planner would do with the form's settings (pure; no gradio).

The page never probes the hardware itself: the caller passes the profile the
engine process reported (``WorkerClient.hardware_profile()``).
"""
from __future__ import annotations

from pathlib import Path

from engine.device.hardware import HardwareProfile
from engine.models.single_file import transformer_folder
from engine.planning.explain import strategy_words
from engine.planning.places import ComponentPlace
from engine.planning.plan import Plan
from engine.service.ahead import plan_settings
from engine.models.loras import as_lora
from engine.settings.loras import lora_folder, lora_line
from engine.settings.draft import prepare
from engine.settings.fields import AUTO, OWN_TRANSFORMER
from engine.settings.values import Settings
from engine.words import plural
from ui.context import AppContext
from ui.views.job_view import PHASE_LABELS
from ui.views.text import code, plain

# The GPUs dropdown (shown on a machine with more than one): Auto, or how many GPUs split the job's denoise.
MAX_GPU_CHOICES = 8


def gpu_choices(count: int) -> list[str]:
    """The GPUs dropdown's choices on a machine of ``count`` GPUs: Auto, then 1 to ``count`` (at most 8)."""
    return [AUTO, *(str(n) for n in range(1, min(count, MAX_GPU_CHOICES) + 1))]


# Where a component can live, in the order the phase table lists them.
PLACES = tuple(ComponentPlace)


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


def form_plan_markdown(ctx: AppContext, hardware: HardwareProfile, mode: str, values: dict) -> str:
    """The plan for a generation tab's current values (raw, by field name: the preset, the form's model, size
    and frames, the plan panel's choices; ``extend``: the video an extension continues, if any), or one line
    saying why there is none."""
    values = dict(values)
    extends = bool(values.pop("extend", None))
    try:
        settings = form_settings(ctx, mode, values)
        plan = plan_settings(settings, hardware, ctx.client.catalog, ctx.client.engine_count())
    except ValueError as exc:   # InputError, ModelError and a bad override are all ValueErrors
        problems = getattr(exc, "problems", ())
        if len(problems) > 1:
            return "**No plan yet:**\n" + "\n".join(f"- {plain(problem)}" for problem in problems)
        return f"**No plan yet:** {plain(exc)}"
    kind = {"i2v": "image to video", "v2v": "video to video"}.get(mode, "video")
    subject = (f"_For {code(settings.model)}, {kind} {settings.width}x{settings.height}, "
               f"{plural(settings.frames, 'frame')}, on {hardware.summary()}._")
    return subject + "\n\n" + time_line(ctx, settings, plan, hardware, extends) + plan_markdown(plan)


def time_line(ctx: AppContext, settings: Settings, plan: Plan, hardware: HardwareProfile, extends: bool = False) -> str:
    """'**About 41 s**' for these settings, from this machine's measured rates (none before they are measured:
    the first run measures them); ``extends``: the video is joined after the one it extends, which is counted."""
    from engine.planning.job_time import videos_seconds
    from engine.service.ahead import predicted_job

    job = predicted_job(settings, plan, hardware, ctx.client.catalog, ctx.outputs_dir, ctx.client.models_dir, extends)
    if job is None:
        return ""
    over = ctx.ceiling.refusal(job)
    if over:   # the job would be refused: said first, as Generate would say it
        return f"**Too long for this server:** {plain(over)}\n\n"
    first, loaded, count = job.first, job.loaded, job.videos
    if count > 1:
        return (f"**About {_secs(videos_seconds(first, loaded, count))}** to make these {count} videos (the first "
                f"{_secs(first.total)}, each other one {_secs(videos_seconds(loaded, loaded, 2) - loaded.total)} on "
                f"the loaded model, the prompt encoded once{_after_words(first.seconds, '; each video ')}), predicted "
                "from this machine's measured speed.\n\n")
    return (f"**About {_secs(first.total)}** to make this video ({_secs(loaded.total)} when the model is already "
            f"loaded; denoising {_secs(first.seconds.get('denoise', 0))}, decoding "
            f"{_secs(first.seconds.get('vae_decode', 0))}{_after_words(first.seconds, ', ')}), predicted from this "
            "machine's measured speed.\n\n")


# How the time line names the steps after the video.
AFTER_WORDS = {"interpolate": "smoother", "upscale": "larger", "join": "joining"}


def _after_words(seconds: dict, before: str) -> str:
    """``before`` + 'smoother 3.2 s, larger 30 s' for the steps after the video a prediction has, else ''."""
    said = [f"{words} {_secs(seconds[phase])}" for phase, words in AFTER_WORDS.items() if phase in seconds]
    return before + ", ".join(said) if said else ""


def _secs(seconds: float) -> str:
    """'41 s', '2.4 s', '0.3 s': whole seconds from ten on."""
    return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"


def form_settings(ctx: AppContext, mode: str, values: dict) -> Settings:
    """The settings the form's values make (raw, by field name; ``preset`` names the preset they start from),
    made and checked as Generate makes them (engine/settings/draft.py: an empty box is missing there too)."""
    values = dict(values)
    preset = ctx.preset_or_default(values.pop("preset", None), mode)
    return prepare(values, preset.settings, mode, ctx.paths, ctx.client.catalog.limits)
