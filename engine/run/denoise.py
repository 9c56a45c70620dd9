"""From the loaded model to a job's latents: the step's speed-ups, the LoRAs, the image's encoding, the denoise.

A ``Denoiser`` serves one job on the loaded model: it sets the plan's attention and compiling, puts the request's
LoRAs on the transformers, encodes an image-to-video run's frames, and runs the pipeline to latents with the step
cache on, the step-end callbacks (engine/run/step_callbacks.py) composed, and A14B's experts brought to the device
in turn. What differs for a job split across GPUs is its JobScope's (engine/run/job_scope.py).
"""
from __future__ import annotations

from contextlib import contextmanager, nullcontext
from pathlib import Path

from engine.device.runtime import clock
from engine.events import Phase
from engine.models.spec import TEXT_TOKENS, TRANSFORMERS
from engine.models.windows import job_windows
from engine.run.apply_plan import encoder_visiting, torch_dtype
from engine.run.clip_input import clip_image_embeds
from engine.run.experts import switch_step
from engine.run.guidance_batch import batched_guidance
from engine.run.job import Cancelled, Job
from engine.run.job_scope import JobScope
from engine.run.loaded import ImageInputs, LoadedModel, reusing_image_embeds
from engine.run.preview import LivePreview
from engine.run.schedulers import make_scheduler
from engine.run.step_callbacks import StepClock, step_callbacks
from engine.run.step_clock import FirstPass, transformers_of
from engine.run.windows import windowed
from engine.settings.request import GenerationRequest

CALIBRATION_FOLDER = ".calibration"   # in the models folder: MagCache's ratios per model and step count


class Denoiser:
    """One job's steps on ``loaded``: given the job, its scope, the request, the models folder (fast decoders,
    MagCache's ratios) and how often to preview (seconds; negative: never)."""

    def __init__(self, job: Job, scope: JobScope, loaded: LoadedModel, request: GenerationRequest,
                 models_dir: Path, preview_seconds: float):
        self.job, self.scope, self.loaded, self.request = job, scope, loaded, request
        self.models_dir, self.preview_seconds = models_dir, preview_seconds
        self.pipe = loaded.for_mode(request.settings.mode)

    # ----- the step's speed: attention, compiling, LoRAs -------------------------
    def apply_speed(self) -> None:
        """The plan's attention backend and compiling, on the loaded pipeline (cheap when unchanged)."""
        from engine.run.speedups import compile_transformer, fp8_linears, set_attention, uncompile_transformer

        plan = self.loaded.plan
        set_attention(self.pipe, None if plan.attention_backend == "native" else plan.attention_backend)
        if plan.fp8_compute and fp8_linears(self.pipe):   # before compiling: the graphs take the float8 linears
            self.job.info("The transformer's block linears now compute in float8 (approximate).")
        if plan.compile:
            if compile_transformer(self.pipe):
                self.job.info("Compiling the transformer's blocks: the first step at each new size takes longer "
                              "(seconds to a minute), every later one is faster.")
        else:
            uncompile_transformer(self.pipe)

    def apply_loras(self) -> None:
        """The request's LoRAs on the loaded transformer(s), each file read once and kept (engine/run/lora.py), in
        their own phase; without any, the adapters the model holds are turned off (at once: no phase)."""
        from engine.run.lora import apply_loras, loaded_adapters
        from engine.run.lora_diffs import added_key
        from engine.run.lora_fusion import merged_key

        loaded, pipe, job = self.loaded, self.pipe, self.job
        parked = loaded.experts.parked if loaded.experts is not None else nullcontext
        if self.request.settings.loras:
            with job.in_phase(Phase.LORA) as phase:
                setup = apply_loras(pipe, self.request.settings.loras, loaded.model.ref, torch_dtype(loaded.plan.dtype),
                                    streamed=loaded.plan.transformer != "device" or loaded.plan.swaps_experts,
                                    disk=loaded.plan.transformer == "disk", parked=parked)
                phase.detail = setup.detail
            job.applied_loras(setup.sentences(), beside=bool(setup.beside))
            return
        if any(merged_key(model) or added_key(model) for model in transformers_of(pipe)):   # originals back: timed
            with job.in_phase(Phase.LORA) as phase:
                setup = apply_loras(pipe, (), parked=parked)
                phase.detail = "merge taken out"
        elif loaded_adapters(pipe):
            setup = apply_loras(pipe, (), parked=parked)
        else:
            return
        job.applied_loras(setup.sentences())

    # ----- the image, then the denoise ----------------------------------------------
    def encode_image(self) -> ImageInputs:
        settings = self.request.settings
        if settings.mode != "i2v":
            return ImageInputs()
        from engine.settings.images import fit_image

        image = fit_image(self.request.image, settings.width, settings.height)
        last = (fit_image(self.request.last_image, settings.width, settings.height, name="last image")
                if self.request.last_image else None)
        if getattr(self.pipe, "image_encoder", None) is None:   # Wan2.2 TI2V-5B: the image goes into the latents only
            return ImageInputs(image, last)
        with self.job.in_phase(Phase.IMAGE_ENCODE):
            with encoder_visiting(self.pipe, "image_encoder", self.loaded.plan):
                embeds = clip_image_embeds(self.pipe, [image] if last is None else [image, last], self.loaded.plan.device)
        return ImageInputs(image, last, embeds)

    def encode_video(self):
        """A video-to-video run's input as latents, in its own timed phase (None for the other modes, and when
        every step runs: strength 1 makes a new video from the noise alone, as text to video does)."""
        settings = self.request.settings
        if settings.mode != "v2v" or settings.denoise_steps >= settings.steps:
            if settings.mode == "v2v":
                self.job.info("Strength 1 makes a new video from the prompt: the input video is not used.")
            return None
        from engine.run.video_input import encode_video

        with self.job.in_phase(Phase.VIDEO_ENCODE) as phase:
            encoded = encode_video(self.pipe, self.request, self.loaded.plan.device)
            phase.detail = f"{settings.frames} frames at {settings.fps} fps, {settings.width}x{settings.height}"
        return encoded

    def denoise(self, embeds: tuple, image: ImageInputs, video=None):
        """The latents of the request's steps (from ``video``'s, a video-to-video input's encoding, when given);
        Cancelled when a cancel (agreed by every rank of a split job) stopped them first."""
        total, switch = self._prepare()
        if video is not None and total == 0:   # no step to run: the input comes back through the VAE
            self.job.info(f"Strength {self.request.settings.strength:g} of {self.request.settings.steps} steps runs "
                          "none: the input video comes back as it is.")
            return video
        start = self._start(video)
        step_clock = StepClock(self.job.device)
        leads = self.scope.leads
        previews = LivePreview(self.job.id, total, self.preview_seconds if leads else -1,
                               self.request.settings.fps / self.pipe.vae_scale_factor_temporal,
                               lambda: self.loaded.previews(self.models_dir))
        callbacks = step_callbacks(self.job, total, step_clock, previews, lambda: self.scope.stops(self.job), switch,
                                   lambda: self._bring_expert(TRANSFORMERS[1]))
        with self.job.in_phase(Phase.DENOISE) as phase:
            self._bring_expert(TRANSFORMERS[0] if switch != 0 else TRANSFORMERS[1])
            # The first step is timed from the transformer's first pass: what the pipeline does before it
            # (image-to-video encodes its conditioning frames with the VAE, 0.45 s for a 14B 480p video) is the
            # denoise phase's, said in its detail, not the first step's (which would skew the mean and the ETA).
            prepared = FirstPass(self.job.device, clock, step_clock.mark)
            phase.detail = prepared.detail
            windows = job_windows(self.loaded.model.spec, self.request.settings)
            if windows is not None:
                self.job.ran_windows(windows)
            batched = embeds[1] if self.loaded.plan.guidance_batch and self.request.settings.guidance > 1.0 else None
            try:
                with reusing_image_embeds(self.pipe, image.embeds), self._step_cache(), \
                        batched_guidance(transformers_of(self.pipe), batched), \
                        windowed(transformers_of(self.pipe), windows, lambda i, n: self.job.window_done(i, n, total)), \
                        prepared.watching(transformers_of(self.pipe)):
                    output = self._call_pipe(embeds, image, callbacks, start)
            finally:
                previews.close()   # the last preview belongs to the denoising, before anything after it
        if len(self.job.step_seconds) < total or self.scope.stops(self.job, last=True):
            raise Cancelled()
        return output.frames

    def _prepare(self) -> tuple[int, int | None]:
        """(the steps, the index of the first low-noise expert's step): the request's scheduler on the pipeline,
        and for A14B the steps each expert runs, recorded."""
        from engine.run.speedups import steps_per_transformer

        settings, pipe = self.request.settings, self.pipe
        pipe.scheduler = make_scheduler(self.loaded.scheduler_config, settings.shift, settings.sigmas,
                                        settings.scheduler, self.request.seed, settings.steps, settings.denoise_steps)
        total = settings.denoise_steps
        counts = steps_per_transformer(pipe, total)
        switch = switch_step(counts, total)
        if TRANSFORMERS[1] in counts:
            self.job.ran_experts({"steps": counts, "switch_step": switch, "swapped": self.loaded.experts is not None,
                                  "boundary_ratio": pipe.config.boundary_ratio})
        return total, switch

    def _start(self, video):
        """The latents the denoise starts from: a video-to-video input noised to its first kept step (None: the
        pipeline's own noise)."""
        if video is None:
            return None
        from engine.run.schedulers import first_sigma
        from engine.run.video_input import starting_latents

        settings = self.request.settings
        return starting_latents(self.pipe, self.request, video, first_sigma(self.pipe.scheduler, settings.steps))

    def _call_pipe(self, embeds: tuple, image: ImageInputs, callbacks, latents=None):
        import torch

        settings = self.request.settings
        positive, negative = embeds
        return self.pipe(
            prompt_embeds=positive, negative_prompt_embeds=negative if settings.guidance > 1.0 else None,
            height=settings.height, width=settings.width, num_frames=settings.frames,
            num_inference_steps=settings.steps, guidance_scale=settings.guidance,
            **({"guidance_scale_2": settings.guidance_2} if settings.guidance_2 is not None else {}),
            generator=torch.Generator("cpu").manual_seed(self.request.seed),
            max_sequence_length=TEXT_TOKENS, output_type="latent", callback_on_step_end=callbacks,
            **({"latents": latents} if latents is not None else {}), **image.pipe_inputs())

    def _bring_expert(self, name: str) -> None:
        """With one expert on the device at a time: expert ``name`` there, the other back in RAM, in the timed
        expert_swap phase (nothing happens when it is there already, or when the plan keeps both on the device)."""
        experts = self.loaded.experts
        if experts is None or experts.on_device == name:
            return
        with self.job.in_phase(Phase.EXPERT_SWAP) as phase:
            experts.bring(name)
            low = name == TRANSFORMERS[1]
            phase.detail = ("the low-noise expert on the device, the high-noise one back in RAM" if low
                            else "the high-noise expert back on the device for a new run")

    @contextmanager
    def _step_cache(self):
        """The request's step cache (approximate) on the transformer while it denoises, removed afterwards;
        MagCache's first run with a model and step count calibrates it (computes every step) and keeps its
        ratios for the next runs."""
        kind, steps = self.request.settings.step_cache, self.request.settings.steps
        if not kind:
            yield
            return
        from engine.run.speedups import (apply_step_cache, calibration_ratios, load_mag_ratios, remove_step_cache,
                                         save_mag_ratios, uncompile_transformer)

        folder, key = self.models_dir / CALIBRATION_FOLDER, self._cache_key()
        uncompile_transformer(self.pipe)   # a cache's hooks need the plain blocks
        setup = apply_step_cache(self.pipe, kind, steps, load_mag_ratios(folder, key, steps) if kind == "mag" else None)
        self.job.used_step_cache(setup.detail)
        try:
            yield
            if setup.calibrating and len(self.job.step_seconds) == steps:
                save_mag_ratios(folder, key, steps, calibration_ratios(self.pipe))
        finally:
            remove_step_cache(self.pipe)

    def _cache_key(self) -> str:
        """What MagCache's ratios depend on: the model, its version, the scheduler and its shift, its LoRAs."""
        settings, model = self.request.settings, self.loaded.model
        loras = tuple((lora.shown, lora.strength) for lora in settings.loras if lora.strength)
        return "-".join(str(part) for part in (model.ref, model.revision, settings.scheduler, settings.shift,
                                                settings.mode, *((loras,) if loras else ())))
