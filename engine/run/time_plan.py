"""The engine's side of the time plan: this machine's measured rates, and the runs it has seen.

The prediction itself is a pure function (engine/planning/timing.py); this keeps what it needs between jobs:
the calibration (measured once per machine and torch version, kept as ``.calibration.json`` beside the
outputs; the disk's rate learned from the first real load) and the recent runs of each model and plan, which
correct the next prediction (``learn``; the steps after the video from any model's runs: ``learn_post``). It also
says which of the users' files the steps after the video will find (``post_files``), which the pure time model
takes as data.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from engine.models.single_file import read_bytes
from engine.models.windows import window_count
from engine.planning.memory import denoise_tokens
from engine.planning.learning import MeasuredRun, learn, learn_post
from engine.planning.job_time import JobTime
from engine.planning.post_time import PostFiles, post_works
from engine.planning.timing import PhaseTimes, predict_times

# A first step this many times the others' mean paid a one-off cost (compiling, warming up): a learned
# prediction leaves it out.
ONE_OFF_FACTOR = 1.5
# Runs kept per model and plan: enough to fit how a step grows with the video's length.
KEPT_RUNS = 8
# The compute dtype the calibration measures in, per backend (the planner's).
CALIBRATION_DTYPES = {"cuda": "bfloat16", "rocm": "bfloat16", "mps": "float16", "cpu": "float32"}


def calibration_enabled(asked: bool | None) -> bool:
    """Whether the engine measures this machine: as asked, else unless WAN_STUDIO_CALIBRATE=0 (the test suite
    sets it, so hundreds of short test jobs don't each measure the CPU)."""
    if asked is not None:
        return asked
    return os.environ.get("WAN_STUDIO_CALIBRATE", "1").strip() != "0"


# One self-attention call of the 1.3B model at 480p (12 heads of 128, 8190 tokens: 33 frames) times each
# attention backend this machine can run; the fastest serves every model (the ranking held on an H200 for
# 12 and 40 heads at 32760 tokens, docs/speed.md).
ATTENTION_PROBE = (12, 128, 8190)


def _attention_seconds(device: str, dtype: str) -> dict:
    """Seconds of one attention call on each usable backend (none on the CPU, where only torch's own runs)."""
    if device == "cpu":
        return {}
    import torch

    from engine.run.speedups import measure_attention, usable_attention_backends

    heads, dim, tokens = ATTENTION_PROBE
    return measure_attention(device, getattr(torch, dtype), heads, dim, tokens, usable_attention_backends(device), 3)


def _calibrated_attention(calibration) -> str:
    """The quickest attention backend the calibration measured here ("" when none was)."""
    from engine.run.speedups import fastest_attention

    seconds = getattr(calibration, "attention_seconds", None) or {}
    return fastest_attention(seconds) if seconds else ""


def with_fastest_attention(hardware, calibration):
    """``hardware`` with the attention backend ``calibration`` measured fastest (as it is when none was measured):
    the one profile the engine runs with and the page and the command line plan with."""
    fastest = _calibrated_attention(calibration)
    return replace(hardware, attention=fastest) if fastest and hardware.attention != fastest else hardware


def measured_hardware(hardware, folder: Path | str):
    """``hardware`` as the engine will run it once it has read this machine's calibration kept in ``folder`` (the
    outputs folder); unchanged when none was kept for this device and torch."""
    from engine.device.calibrate import Calibration
    from engine.device.compile_cache import compiled_sizes

    measured = with_fastest_attention(hardware, Calibration.load(Path(folder), hardware))
    return replace(measured, compiled_sizes=compiled_sizes(folder))


@dataclass
class TimePlanner:
    models_dir: Path
    enabled: bool = True
    _calibration: object = None          # engine.device.calibrate.Calibration
    _folder: Path | None = None          # where it is kept
    _runs: dict | None = None                       # plan family (family_key) -> [MeasuredRun], newest last
    _compiled: set = field(default_factory=set)     # the shapes (``_shape``) already run compiled

    def calibration(self, folder: Path, hardware, measure: Callable[[Callable], object]):
        """This machine's rates: in memory, else read from ``folder``, else measured now through ``measure``
        (which runs the work as a timed phase of the job) and kept in ``folder``. None when turned off."""
        if not self.enabled:
            return None
        from engine.device.calibrate import Calibration

        if self._calibration is not None and self._calibration.matches(hardware):
            return self._calibration
        found = Calibration.load(folder, hardware)
        if found is None:
            from engine.device.calibrate import calibrate
            from engine.outputs.export_rates import export_rates

            device, dtype = hardware.device, CALIBRATION_DTYPES[hardware.backend]
            found = measure(lambda: replace(calibrate(device, dtype, quick=device == "cpu",
                                                      export_rates=export_rates),
                                            attention_seconds=_attention_seconds(device, dtype)))
            # Named as the engine knows its hardware, so the file is found again on this machine.
            found = replace(found, device_name=hardware.device_name, backend=hardware.backend,
                            torch_version=hardware.torch_version)
            self._keep(found, folder)
        self._calibration, self._folder = found, Path(folder)
        return found

    def known(self, folder: Path, hardware):
        """This machine's rates if they were measured already (in memory or kept in ``folder``), without
        measuring; None otherwise or when turned off."""
        if not self.enabled:
            return None
        from engine.device.calibrate import Calibration

        if self._calibration is not None and self._calibration.matches(hardware):
            return self._calibration
        found = Calibration.load(folder, hardware)
        if found is not None:
            self._calibration, self._folder = found, Path(folder)
        return found

    def _keep(self, calibration, folder: Path) -> None:
        try:
            calibration.save(folder)
        except OSError:   # a read-only or full outputs folder: predictions still work in this process
            pass

    def loaded(self, nbytes: int, seconds: float) -> None:
        """A real load read ``nbytes`` in ``seconds``: the disk's rate for the next predictions of a load."""
        if self._calibration is not None and nbytes and seconds > 0:
            self._calibration = self._calibration.with_disk_rate(nbytes / seconds / 1e9)
            self._keep(self._calibration, self._folder)

    def predict(self, resolved, plan, request, calibration, loaded: bool) -> PhaseTimes | None:
        """The seconds of each phase of ``request`` under ``plan``, corrected by this model's recent runs (the same
        prediction the page's plan makes: ``predict_job``)."""
        if calibration is None:
            return None
        s = request.settings
        compiled = plan.compile and self._shape(resolved.ref, s, plan) in self._compiled
        return predict_job(resolved.spec, resolved.ref, s, plan, calibration, self._known_runs(calibration), loaded,
                           compiled, None if loaded else read_bytes(resolved) or None, post_files(self.models_dir),
                           extends=bool(request.extend))

    def predict_whole(self, resolved, plan, request, calibration, loaded: bool) -> JobTime | None:
        """The whole job's time (all its ``count`` videos), as the page's plan and the server's ceiling count it."""
        if calibration is None:
            return None
        s = request.settings
        return whole_job(resolved.spec, resolved.ref, s, plan, calibration, self._known_runs(calibration),
                         post_files(self.models_dir), bool(request.extend), loaded,
                         plan.compile and self._shape(resolved.ref, s, plan) in self._compiled,
                         None if loaded else read_bytes(resolved) or None)

    def _known_runs(self, calibration) -> dict:
        """The runs seen on this machine: this process's, else those kept beside the outputs by earlier ones."""
        if self._runs is None:
            self._runs = kept_runs(self._folder, calibration) if self._folder else {}
        return self._runs

    def finished(self, loaded_model, request, timings: dict, step_seconds: list, was_loaded: bool,
                 decoder: str, model_step: float | None = None, model_seconds: dict | None = None) -> None:
        """Keep a finished run, to correct the next predictions for the same model and plan (``model_step``: the
        time model's own step for it), in this process and beside the outputs."""
        s, plan, ref = request.settings, loaded_model.plan, loaded_model.model.ref
        spec = loaded_model.model.spec
        seconds, step = dict(timings), None
        if len(step_seconds) > 1:
            step = sum(step_seconds[1:]) / len(step_seconds[1:])
            if "denoise" in seconds and step_seconds[0] > ONE_OFF_FACTOR * step:
                # A first step that compiled (or warmed up) is not what the next run's first step costs.
                seconds["denoise"] -= step_seconds[0] - step
        # A pass's tokens and the passes a step makes: a longer video's windows each count as a pass.
        run = MeasuredRun({str(k): v for k, v in seconds.items()}, denoise_tokens(spec, s.width, s.height, s.frames,
                                                                                 s.window), s.denoise_steps,
                          (2 if s.guidance > 1.0 else 1) * window_count(spec, s), s.width * s.height * s.frames, step,
                          loaded=was_loaded, prompts=2 if s.guidance > 1.0 else 1,
                          model_step=model_step, post=self._post_counted(s, plan.device, seconds),
                          model_seconds=dict(model_seconds or {}))
        runs = self._known_runs(self._calibration).setdefault(family_key(ref, plan, s), [])
        runs.append(run)
        del runs[:-KEPT_RUNS]
        if plan.compile:
            self._compiled.add(self._shape(ref, s, plan))
        if self._folder is not None and self._calibration is not None:
            keep_runs(self._folder, self._calibration, self._runs)

    def _post_counted(self, settings, device: str, seconds: dict) -> dict:
        """The steps after the video a finished run went through, as the time model counts them (the files found
        now: the run looked a moment ago)."""
        works = post_works(settings.width, settings.height, settings.frames, settings.interpolate, settings.upscale,
                           device, post_files(self.models_dir))
        return {work.phase: work.to_dict() for work in works if work.phase in seconds}

    @staticmethod
    def _shape(ref: str, settings, plan) -> tuple:
        """What a compiled graph is made for: the model, the size, the batch and the linears' kind."""
        batched = getattr(plan, "guidance_batch", False) and settings.guidance > 1.0
        return (ref, settings.width, settings.height, settings.frames, batched,
                getattr(plan, "fp8_compute", False))


# The runs this machine made, kept beside the calibration: the page's plan (in the app's process) and a later
# engine process correct their predictions with them as this one does.
RUNS_FILE = ".time-runs.json"


def family_key(ref: str, plan, settings) -> str:
    """What makes two runs comparable, as text: the model and every choice that changes a phase's speed."""
    return json.dumps([ref, plan.strategy, plan.text_encoder, plan.vae_dtype, plan.vae_tile, plan.compile,
                       plan.attention_backend, settings.decoder, settings.step_cache, plan.transformer_files,
                       getattr(plan, "fp8_compute", False),
                       getattr(plan, "guidance_batch", False) and settings.guidance > 1.0], default=str)


def predict_job(spec, ref: str, settings, plan, calibration, runs: dict, loaded: bool, compiled: bool = False,
                weight_bytes: int | None = None, files: PostFiles = PostFiles(), extends: bool = False) -> PhaseTimes:
    """The one prediction of a job's phases: the time model's (engine/planning/timing.py) corrected by this
    machine's runs of the same model and plan (engine/planning/learning.py), the steps after the video by any run
    of the same method. ``files``: what the models folder holds for those steps (``post_files``); ``extends``: the
    job is an extension, joined after its video. The engine's status, its chart and the page's plan all say this."""
    s = settings
    times = predict_times(spec, s.width, s.height, s.frames, s.denoise_steps, s.guidance, plan, calibration,
                          s.decoder, image_to_video=s.mode == "i2v", loaded=loaded, compiled=compiled,
                          weight_bytes=weight_bytes, window=s.window, overlap=s.overlap, interpolate=s.interpolate,
                          upscale=s.upscale, post_files=files, video_input=s.mode == "v2v" and s.denoise_steps < s.steps,
                          extends=extends)
    learned = learn(times, runs.get(family_key(ref, plan, s), []))
    return learn_post(learned, [run for kept in runs.values() for run in kept])


def post_files(models_dir: Path | str) -> PostFiles:
    """What the steps after the video will find in ``models_dir`` (engine/post/apply.py looks in the same folders):
    a RIFE file in interpolators/, and the size of the upscaler file in upscalers/ (0: none or unreadable)."""
    from engine.post.rife import find_rife
    from engine.post.steps import INTERPOLATORS_FOLDER, UPSCALERS_FOLDER
    from engine.post.upscale import find_upscaler

    upscaler = find_upscaler(Path(models_dir) / UPSCALERS_FOLDER)
    try:
        size = upscaler.stat().st_size if upscaler is not None else 0
    except OSError:
        size = 0
    return PostFiles(find_rife(Path(models_dir) / INTERPOLATORS_FOLDER) is not None, size)


def whole_job(spec, ref: str, settings, plan, calibration, runs: dict, files: PostFiles = PostFiles(),
              extends: bool = False, loaded: bool = False, compiled: bool = False,
              weight_bytes: int | None = None) -> JobTime:
    """The whole job's prediction: its first video (on the model as it is now: ``loaded`` or not) and each other
    one of its ``count`` on the loaded model (``predict_job`` for both)."""
    first, again = (predict_job(spec, ref, settings, plan, calibration, runs, loaded=state, compiled=compiled,
                                weight_bytes=weight_bytes, files=files, extends=extends) for state in (loaded, True))
    count = settings.count if isinstance(settings.count, int) and settings.count > 1 else 1
    return JobTime(first, again, count)


def _machine(calibration) -> list:
    return [calibration.device_name, calibration.backend, calibration.torch_version]


def kept_runs(folder: Path | str, calibration) -> dict:
    """The runs kept in ``folder`` for the machine ``calibration`` measured ({} when none, or another's)."""
    try:
        data = json.loads((Path(folder) / RUNS_FILE).read_text(encoding="utf-8"))
        if data.get("machine") != _machine(calibration):
            return {}
        return {key: [MeasuredRun.from_dict(run) for run in runs][-KEPT_RUNS:]
                for key, runs in data.get("runs", {}).items() if isinstance(key, str) and isinstance(runs, list)}
    except (OSError, ValueError, TypeError, AttributeError):
        return {}


def keep_runs(folder: Path | str, calibration, runs: dict) -> None:
    """Write ``runs`` beside the outputs, whole or not at all (a read-only folder keeps them in memory only)."""
    from engine.atomic import write_atomically

    text = json.dumps({"schema": 1, "machine": _machine(calibration),
                       "runs": {key: [run.to_dict() for run in kept] for key, kept in runs.items()}}, default=str)
    try:
        write_atomically(Path(folder) / RUNS_FILE, lambda temporary: temporary.write_text(text, encoding="utf-8"))
    except OSError:
        pass
