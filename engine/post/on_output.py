"""Smoother or larger, on an output already made (the History tab's buttons, ``app.py post``): a new output beside
it, with its own sidecar, the earlier one left as it is.

The new sidecar is the earlier one's, its file and what was written updated, the step appended to its "post" list
and its settings' factor multiplied, so that Reuse settings makes the new output in one run.
"""
from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from engine.device.runtime import peak_vram_gb
from engine.errors import InputError
from engine.events import JobFinished
from engine.outputs.bundle import Bundle
from engine.outputs.kept_inputs import carry_inputs
from engine.outputs.sidecar import Sidecar, SidecarError, read_sidecar, write_sidecar
from engine.post.apply import Media, StepRunner, check_step_files, run_steps
from engine.post.steps import FACTORS, PostStep, post_problems

# How the new output's name says what was done to the earlier one's.
NAME_ENDINGS = {"interpolate": "smoother", "upscale": "larger"}


def read_output(path: Path) -> tuple[Bundle, Sidecar]:
    """The output whose media file is ``path``, and its sidecar; InputError when it is not an output of this app."""
    path = Path(path)
    bundle = Bundle.from_media(path)
    if not path.is_file() or path.is_symlink():
        raise InputError(f"{path.name} is not there any more: refresh the history and pick another output")
    try:
        sidecar = read_sidecar(bundle.sidecar)
    except (OSError, SidecarError) as exc:
        raise InputError(f"{path.name} has no readable sidecar ({exc}), so what it is cannot be known: pick an "
                         "output this app made") from None
    return bundle, sidecar


def check_step(step: PostStep, sidecar: Sidecar, media: Media) -> None:
    """InputError when ``step`` cannot run on this output: a still made smoother, a size or rate past what a
    video holds, or a factor past 4 in all (the settings could not ask for it again)."""
    interpolate, upscale = (step.factor, 1) if step.kind == "interpolate" else (1, step.factor)
    problems = post_problems(interpolate, upscale, sidecar.mode, media.frames, media.width, media.height, media.fps)
    done = sidecar.settings()
    before = getattr(done, step.kind)
    if not problems and before * step.factor not in FACTORS:
        word = "smoother" if step.kind == "interpolate" else "larger"
        problems.append(f"this output is already {before}x {word}; {step.factor}x more would be "
                        f"{before * step.factor}x, past the {FACTORS[-1]}x this app makes: pick the output it was "
                        "made from, or a lower factor")
    if problems:
        raise InputError(problems)


def new_bundle(bundle: Bundle, step: PostStep) -> Bundle:
    """An unused bundle beside ``bundle``, named for the step: ``<stem>_smoother2x``, then ``..._2``, ..."""
    base = f"{bundle.stem.name}_{NAME_ENDINGS[step.kind]}{step.factor}x"
    stem, n = bundle.stem.with_name(base), 1
    while Bundle(stem).in_use():
        n += 1
        stem = bundle.stem.with_name(f"{base}_{n}")
    return Bundle(stem)


def post_on_output(job, path: Path, step: PostStep, models_dir: Path, device: str) -> JobFinished:
    """``step`` on the output at ``path``, as ``job`` (engine/run/job.py): a new output and sidecar beside it."""
    bundle, sidecar = read_output(path)
    media = Media.read(bundle.media_named(sidecar.file) or Path(path))
    check_step(step, sidecar, media)
    check_step_files(models_dir, (step,))
    target = new_bundle(bundle, step)
    dest = target.image if media.still else target.video
    job.use_device(device)
    made, records = run_steps(job, StepRunner(models_dir, device, job), (step,), media, dest, source=media.path.name)
    record = _derived(sidecar, made, records[0].to_dict(), job.timings, target, bundle)
    written = write_sidecar(record, target.sidecar)
    return JobFinished(job.id, (str(dest),), str(written), sidecar.seed, dict(job.timings), peak_vram_gb(),
                       job.ram.peak_gb, f"{step.title} made from {media.path.name}.")


def _derived(sidecar: Sidecar, made: Media, step: dict, timings: dict, target: Bundle, source: Bundle) -> Sidecar:
    """The new output's sidecar: the earlier one's, for the new file, the step appended and its factor counted in
    the settings; the seconds of the earlier run and of this step together."""
    factor_name = step["step"]
    before = sidecar.settings()
    parameters = {**sidecar.parameters, factor_name: getattr(before, factor_name) * step["factor"]}
    output = {"frames": made.frames, "height": made.height, "width": made.width, "fps": made.fps}
    seconds = dict(sidecar.timings)
    for phase, value in timings.items():
        seconds[phase] = round(seconds.get(phase, 0.0) + value, 4)
    inputs = carry_inputs(sidecar.inputs, source.stem.parent, target.stem) if sidecar.inputs else None
    return replace(sidecar, file=made.path.name, parameters=parameters, output=output, post=[*sidecar.post, step],
                   timings=seconds, created=time.strftime("%Y-%m-%dT%H:%M:%S%z"), inputs=inputs)
