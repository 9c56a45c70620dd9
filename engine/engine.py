"""The Engine: owns at most one loaded pipeline and runs generation jobs as timed phases.

A run reads like a pipeline: check, load, encode text, encode image, denoise,
decode, export. Each phase is timed with the device synchronised and
reported as typed events through ``emit``.
"""
from __future__ import annotations

import platform
import secrets
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from . import __version__
from .events import (Event, Info, JobCancelled, JobFailed, JobFinished, JobStarted, PhaseFinished,
                     PhaseStarted, StepFinished, DownloadProgress)
from .export import output_stem, to_uint8, write_json, write_mp4, write_png
from .failures import failure_event
from .hardware import HardwareProfile, detect_hardware
from .models import ResolvedModel, classify_ref, resolve_model, size_multiple_of
from .plan import Plan, component_params, make_plan
from .request import GenerationRequest, InputError, check_inputs
from .runtime import RamPeakSampler, clock, free_device_memory, peak_vram_gb, reset_peak_vram, synchronize
from .schedulers import make_scheduler

SELFTEST_NOTE = "Noise from a self-test model: random weights, made to check the app works, not to look like anything."
Emit = Callable[[Event], None]


class Cancelled(Exception):
    """The user asked to stop; raised at a step or phase boundary."""


@dataclass
class LoadedModel:
    model: ResolvedModel
    pipe: object
    plan: Plan
    scheduler_config: dict


@dataclass
class _Job:
    """What one run accumulates: its id, the emitter, timings and step times."""
    id: str
    emit: Emit
    should_cancel: Callable[[], bool]
    device: str = "cpu"
    phase: str | None = None
    timings: dict = field(default_factory=dict)
    step_seconds: list = field(default_factory=list)


class Engine:
    def __init__(self, models_dir: Path | str = "models", hardware: HardwareProfile | None = None):
        self.models_dir = Path(models_dir)
        self._hardware = hardware
        self.loaded: LoadedModel | None = None

    @property
    def hardware(self) -> HardwareProfile:
        if self._hardware is None:
            self._hardware = detect_hardware()
        return self._hardware

    # ----- model management -------------------------------------------------
    def unload(self) -> None:
        """Drop the loaded pipeline and give its memory back."""
        if self.loaded is not None:
            pipe = self.loaded.pipe
            self.loaded = None
            if hasattr(pipe, "remove_all_hooks"):
                pipe.remove_all_hooks()
            del pipe
        free_device_memory()

    @contextmanager
    def _phase(self, job: _Job, name: str):
        job.phase = name
        job.emit(PhaseStarted(job.id, name))
        synchronize(job.device)
        start = clock()
        yield
        synchronize(job.device)
        seconds = clock() - start
        job.timings[name] = round(job.timings.get(name, 0.0) + seconds, 4)
        job.emit(PhaseFinished(job.id, name, seconds))

    def _ensure_model(self, ref: str, job: _Job) -> LoadedModel:
        if self.loaded is not None and self.loaded.model.ref == ref:
            job.emit(Info(job.id, f"Model {ref} is already loaded: no load needed."))
            return self.loaded
        if self.loaded is not None:
            job.emit(Info(job.id, f"Unloading {self.loaded.model.ref} to make room for {ref}."))
            self.unload()
        if classify_ref(ref) == "hub":
            def progress(done, total, unit):
                job.emit(DownloadProgress(job.id, done, total, unit))
            with self._phase(job, "download"):
                resolved = resolve_model(ref, self.models_dir, progress)
        else:
            resolved = resolve_model(ref, self.models_dir)
        plan = make_plan(self.hardware, component_params(resolved.folder))
        job.device = plan.device
        with self._phase(job, "load"):
            pipe = self._from_pretrained(resolved, plan)
        with self._phase(job, "transfer"):
            self._apply_plan(pipe, plan)
        self.loaded = LoadedModel(resolved, pipe, plan, dict(pipe.scheduler.config))
        return self.loaded

    @staticmethod
    def _from_pretrained(resolved: ResolvedModel, plan: Plan):
        import torch
        import diffusers

        pipeline_class = getattr(diffusers, resolved.pipeline_class)
        dtype = {"default": getattr(torch, plan.dtype), "vae": getattr(torch, plan.vae_dtype)}
        pipe = pipeline_class.from_pretrained(resolved.folder, dtype=dtype)
        pipe.set_progress_bar_config(disable=True)  # progress goes out as events instead
        return pipe

    @staticmethod
    def _apply_plan(pipe, plan: Plan) -> None:
        if plan.offload == "model":
            pipe.enable_model_cpu_offload(device=plan.device)
        else:
            pipe.to(plan.device)
        if plan.vae_tiling:
            pipe.vae.enable_tiling()

    # ----- one run ----------------------------------------------------------
    def run(self, request: GenerationRequest, job_id: str, emit: Emit,
            should_cancel: Callable[[], bool] = lambda: False) -> Event:
        """Run one job to a terminal event (finished, cancelled or failed), which is also emitted."""
        job = _Job(job_id, emit, should_cancel)
        emit(JobStarted(job_id, f"{request.mode} with {request.model}"))
        ram = RamPeakSampler()
        try:
            with ram.running():
                result = self._run(request, job, ram)
        except Cancelled:
            result = JobCancelled(job_id, len(job.step_seconds), request.steps)
        except Exception as exc:  # every failure reaches the page as an event
            result = failure_event(job_id, exc, job.phase)
        emit(result)
        return result

    def _check_cancel(self, job: _Job) -> None:
        if job.should_cancel():
            raise Cancelled()

    def _run(self, request: GenerationRequest, job: _Job, ram: RamPeakSampler) -> Event:
        import torch

        request = check_inputs(request)
        reset_peak_vram()
        loaded_before = self.loaded is not None and self.loaded.model.ref == request.model
        loaded = self._ensure_model(request.model, job)
        job.device = loaded.plan.device
        for sentence in loaded.plan.decisions:
            job.emit(Info(job.id, f"Plan: {sentence}"))
        self._check_model_fits_request(loaded.model, request)
        seed = request.seed if request.seed >= 0 else secrets.randbelow(2**32)
        request = replace(request, seed=seed)
        self._check_cancel(job)

        pipe = loaded.pipe
        with torch.inference_mode():
            embeds = self._encode_text(pipe, request, job)
            image_inputs = self._encode_image(pipe, request, job)
            self._check_cancel(job)
            latents = self._denoise(loaded, request, job, embeds, image_inputs)
            frames = self._decode(pipe, latents, job)
        with self._phase(job, "export"):
            media = self._write_media(request, frames)
        sidecar = self._write_sidecar(loaded, request, job, media, frames, ram, loaded_before)
        return JobFinished(job.id, (str(media),), str(sidecar), seed, dict(job.timings), peak_vram_gb(),
                           ram.peak_gb, SELFTEST_NOTE if loaded.model.selftest else "")

    @staticmethod
    def _check_model_fits_request(model: ResolvedModel, request: GenerationRequest) -> None:
        if request.mode == "i2v" and not model.image_to_video:
            raise InputError(f"{model.ref} is a text-to-video model; pick an image-to-video model for this tab")
        if request.mode != "i2v" and model.image_to_video:
            raise InputError(f"{model.ref} is an image-to-video model; use the Image to Video tab with an image")
        multiple = size_multiple_of(model.folder)
        for name, value in (("width", request.width), ("height", request.height)):
            if value % multiple:
                lower = max(multiple, value // multiple * multiple)
                raise InputError(f"{name} {value} is not a multiple of {multiple}, which {model.ref} needs; try {lower}")

    def _encode_text(self, pipe, request: GenerationRequest, job: _Job):
        with self._phase(job, "text_encode"):
            positive, negative = pipe.encode_prompt(
                prompt=request.prompt, negative_prompt=request.negative_prompt or "",
                do_classifier_free_guidance=request.guidance > 1.0, device=pipe._execution_device)
        return positive, negative

    def _encode_image(self, pipe, request: GenerationRequest, job: _Job) -> dict:
        if request.mode != "i2v":
            return {}
        from .images import fit_image

        image = fit_image(request.image, request.width, request.height)
        last = fit_image(request.last_image, request.width, request.height) if request.last_image else None
        inputs = {"image": image, "last_image": last}
        if getattr(pipe, "image_encoder", None) is not None:
            with self._phase(job, "image_encode"):
                embeds = pipe.encode_image(image if last is None else [image, last], pipe._execution_device)
            inputs["cached_image_embeds"] = embeds
        return inputs

    def _denoise(self, loaded: LoadedModel, request: GenerationRequest, job: _Job, embeds, image_inputs):
        import torch

        pipe = loaded.pipe
        pipe.scheduler = make_scheduler(loaded.scheduler_config, request.shift, request.sigmas)
        total = request.steps
        last = [0.0]

        def on_step_end(pipeline, i, t, tensors):
            synchronize(job.device)
            now = clock()
            seconds = now - last[0]
            last[0] = now
            job.step_seconds.append(round(seconds, 4))
            mean = sum(job.step_seconds) / len(job.step_seconds)
            job.emit(StepFinished(job.id, i + 1, total, seconds, mean * (total - i - 1)))
            if job.should_cancel():
                pipeline._interrupt = True
            return {}

        positive, negative = embeds
        image_inputs = dict(image_inputs)
        cached = image_inputs.pop("cached_image_embeds", None)
        if cached is not None:
            # The pipeline refuses image and image_embeds together, yet needs the image for its
            # latents: shadow its encode_image for this call so the timed encoding is reused.
            pipe.encode_image = lambda *args, **kwargs: cached
        try:
            return self._denoise_loop(pipe, request, job, positive, negative, image_inputs, on_step_end, last)
        finally:
            if cached is not None:
                del pipe.encode_image

    def _denoise_loop(self, pipe, request, job, positive, negative, image_inputs, on_step_end, last):
        import torch

        total = request.steps
        with self._phase(job, "denoise"):
            last[0] = clock()
            output = pipe(
                prompt_embeds=positive,
                negative_prompt_embeds=negative if request.guidance > 1.0 else None,
                height=request.height, width=request.width, num_frames=request.frames,
                num_inference_steps=total, guidance_scale=request.guidance,
                generator=torch.Generator("cpu").manual_seed(request.seed),
                output_type="latent", callback_on_step_end=on_step_end, **image_inputs)
        if len(job.step_seconds) < total or job.should_cancel():
            raise Cancelled()
        return output.frames

    def _decode(self, pipe, latents, job: _Job):
        import torch
        from diffusers.utils.torch_utils import get_module_execution_device

        vae = pipe.vae
        with self._phase(job, "vae_decode"):
            latents = latents.to(get_module_execution_device(vae), dtype=vae.dtype)
            shape = (1, vae.config.z_dim, 1, 1, 1)
            mean = torch.tensor(vae.config.latents_mean).view(shape).to(latents.device, latents.dtype)
            inv_std = 1.0 / torch.tensor(vae.config.latents_std).view(shape).to(latents.device, latents.dtype)
            video = vae.decode(latents / inv_std + mean, return_dict=False)[0]
            frames = pipe.video_processor.postprocess_video(video, output_type="np")[0]
        return to_uint8(frames)

    @staticmethod
    def _write_media(request: GenerationRequest, frames) -> Path:
        stem = output_stem(Path(request.outputs_dir), request.mode, request.prompt, request.seed)
        if request.mode == "t2i":
            return write_png(frames[0], stem.with_suffix(".png"))
        return write_mp4(frames, stem.with_suffix(".mp4"), request.fps)

    def _write_sidecar(self, loaded: LoadedModel, request: GenerationRequest, job: _Job, media: Path,
                       frames, ram: RamPeakSampler, reused: bool) -> Path:
        sidecar = {
            "app": {"name": "wan-studio", "version": __version__},
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "file": media.name,
            "mode": request.mode,
            "prompt": request.prompt,
            "negative_prompt": request.negative_prompt,
            "seed": request.seed,
            "model": {"ref": loaded.model.ref, "source": loaded.model.source,
                      "revision": loaded.model.revision, "pipeline": loaded.model.pipeline_class},
            "preset": request.preset,
            "parameters": {k: v for k, v in request.to_dict().items()
                           if k not in ("prompt", "negative_prompt", "outputs_dir")},
            "output": {"frames": int(frames.shape[0]), "height": int(frames.shape[1]),
                       "width": int(frames.shape[2]), "fps": request.fps if request.mode != "t2i" else None},
            "plan": loaded.plan.to_dict(),
            "model_reused": reused,
            "timings": dict(job.timings),
            "step_seconds": list(job.step_seconds),
            "peak_vram_gb": peak_vram_gb(),
            "peak_ram_gb": ram.peak_gb,
            "versions": _versions(),
            "hardware": self.hardware.to_dict(),
        }
        if loaded.model.selftest:
            sidecar["note"] = SELFTEST_NOTE
        return write_json(sidecar, media.with_suffix(".json"))


def _versions() -> dict:
    import diffusers
    import torch
    import transformers

    return {"app": __version__, "torch": torch.__version__, "diffusers": diffusers.__version__,
            "transformers": transformers.__version__, "python": platform.python_version()}
