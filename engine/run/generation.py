"""One generation job, from a checked request to its outcome, as numbered steps on the Engine's loaded model.

1. resolve the model and check the request fits it; 2. measure the machine (once) and plan; 3. join the other
ranks of a split job; 4. find the files the run needs (fast decoder, LoRAs); 5. load, encode and denoise, one rung
down the planner's ladder on out of memory; 6. finish: save the latents, decode, export, write the sidecar.

What lives across jobs (the loaded model, the prompt encodings, the time plan, the hardware) is the Engine's; a
``Generation`` asks it through ``ModelHost``, and asks its ``JobScope`` where a split job differs.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from engine.device.hardware import HardwareProfile
from engine.device.runtime import peak_vram_gb, reset_peak_vram
from engine.events import Event, JobFinished, Phase
from engine.models.catalog import ModelCatalog, ModelInfo
from engine.settings.model_fit import check_model_fits
from engine.models.refs import ResolvedModel
from engine.models.single_file import use_transformer_files
from engine.models.spec import ModelSpec
from engine.outputs.bundle import INPUT_SUFFIXES, VIDEO_INPUT_SUFFIXES, Bundle
from engine.outputs.export import output_stem
from engine.outputs.kept_inputs import keep_inputs
from engine.outputs.latents import cleanup_latents, save_latents
from engine.outputs.record import run_record
from engine.outputs.sidecar import write_sidecar
from engine.planning.planner import Plan, rungs_below
from engine.post.apply import Media, StepRunner, check_step_files, replace_file, run_steps, work_path
from engine.post.steps import post_steps
from engine.run.apply_plan import set_vae_tiling
from engine.run.decode_stage import Decoder, check_latents
from engine.run.denoise import Denoiser
from engine.run.failures import is_out_of_memory
from engine.run.job import Cancelled, Job
from engine.run.job_scope import JobScope
from engine.run.loaded import LoadedModel
from engine.run.lora import lora_files
from engine.run.prompt_cache import PromptCache
from engine.run.step_clock import transformers_of
from engine.run.time_plan import TimePlanner
from engine.settings.request import GenerationRequest
from engine.settings.values import InputError, check_experts

SELFTEST_NOTE = "Noise from a self-test model: random weights, made to check the app works, not to look like anything."


class ModelHost(Protocol):
    """What a job asks of the Engine (engine/run/engine.py), which keeps it across jobs."""
    models_dir: Path
    latents_hours: float
    preview_seconds: float
    loaded: LoadedModel | None
    prompts: PromptCache
    timing: TimePlanner
    catalog: ModelCatalog

    @property
    def hardware(self) -> HardwareProfile: ...

    def resolve(self, ref: str, job: Job, vet=None) -> ResolvedModel: ...

    def load(self, resolved: ResolvedModel, plan: Plan, job: Job) -> LoadedModel: ...

    def unload(self) -> None: ...

    def plan_for(self, request: GenerationRequest, spec: ModelSpec, strategy: str | None = None,
                 ranks: int = 1) -> Plan: ...

    def measure_machine(self, outputs_dir: Path, job: Job): ...


class Generation:
    """One job on ``host``'s loaded model: ``job`` records it, ``scope`` says whether it is whole or split."""

    def __init__(self, host: ModelHost, job: Job, scope: JobScope):
        self.host, self.job, self.scope = host, job, scope
        self.decoder = Decoder(job, host.models_dir)

    def run(self, request: GenerationRequest) -> Event:
        """Resolve and plan; load and denoise (stepping down on out of memory); then finish."""
        host, job = self.host, self.job
        reset_peak_vram()
        # The settings' transformer files, read and checked against the model before anything loads; a Hub model
        # not downloaded yet is admitted on what its metadata says, before its weights download.
        files = host.catalog.transformer_files(request.settings)

        def before_download(found: ResolvedModel) -> None:
            self._refuse_unless_fits(self._admit(use_transformer_files(found, files), request), request,
                                     f" Only the description of {found.ref} was downloaded (kilobytes), none of its weights.")

        resolved = use_transformer_files(host.resolve(request.settings.model, job, before_download), files)
        plan = self._admit(resolved, request)
        self.scope.join(plan, request.settings.gpus, job)
        self._refuse_unless_fits(plan, request)
        self._say_sampler(resolved, request)
        request = replace(request, seed=request.seed if request.seed >= 0 else self.scope.seed())
        request = self._find_files(resolved, request)
        self._refuse_past_ceiling(resolved, plan, request)
        with self._extension_start(request) as request:
            loaded, latents = self._denoise_stepping_down(resolved, plan, request)
            return self.scope.outcome(job, lambda: self._finish(loaded, request, latents))

    def _admit(self, resolved: ResolvedModel, request: GenerationRequest) -> Plan:
        """The request checked against the model (InputError when the model cannot make what it asks) and planned
        on this machine (measured once)."""
        check_model_fits_request(resolved, request)
        self.host.measure_machine(Path(request.outputs_dir), self.job)
        return self.host.plan_for(request, resolved.spec, ranks=self.scope.ranks)

    @staticmethod
    def _refuse_unless_fits(plan: Plan, request: GenerationRequest, note: str = "") -> None:
        """InputError with the plan's refusal when it cannot fit, unless the settings force a strategy."""
        if not plan.fits and not request.settings.strategy:
            raise InputError(f"{request.settings.model}: {plan.refusal}{note}")

    def _refuse_past_ceiling(self, resolved: ResolvedModel, plan: Plan, request: GenerationRequest) -> None:
        """InputError, before anything loads, when the server that admitted the job set a ceiling on one job's time
        and the whole job (all its videos) is predicted past it: the first job on a machine not measured before is
        checked here, once the machine is measured."""
        if request.max_seconds is None or self.job.video > 1:
            return
        from engine.planning.job_time import JobCeiling

        calibration = self.host.measure_machine(Path(request.outputs_dir), self.job)
        said = JobCeiling(request.max_seconds).refusal(
            self.host.timing.predict_whole(resolved, plan, request, calibration, self._is_loaded(resolved, plan)))
        if said:
            raise InputError(said)

    def _is_loaded(self, resolved: ResolvedModel, plan: Plan) -> bool:
        loaded = self.host.loaded
        return loaded is not None and loaded.model.ref == resolved.ref and loaded.plan.reload_key == plan.reload_key

    def _say_sampler(self, resolved: ResolvedModel, request: GenerationRequest) -> None:
        """A distilled model run with other steps than it was trained for (FastWan's folder under a preset made for
        another model) runs as asked, and says so."""
        sampler, settings = resolved.kind.sampler, request.settings
        if sampler is not None and sampler.differs(settings.scheduler, settings.steps, settings.guidance):
            self.job.info(f"{resolved.ref} is distilled for {sampler.steps} steps of {sampler.scheduler} at guidance "
                          f"{sampler.guidance:g} ({resolved.pipeline_class}); these settings ask {settings.steps} "
                          f"steps of {settings.scheduler} at guidance {settings.guidance:g}, which it was not trained "
                          "for. Its preset has its own settings.")

    @contextmanager
    def _extension_start(self, request: GenerationRequest):
        """An extension's request with the video's last frame as its first frame (a temporary PNG, removed after
        the run, which keeps its own copy as any image-to-video run does); any other request as it is."""
        if not request.extend:
            yield request
            return
        from engine.post.extend import start_image

        start = start_image(Path(request.extend), Path(request.outputs_dir))
        try:
            yield replace(request, image=str(start))
        finally:
            start.unlink(missing_ok=True)

    def _find_files(self, resolved: ResolvedModel, request: GenerationRequest) -> GenerationRequest:
        """Before any heavy work: the fast decoder found (or fetched), the smoother's and larger's files read, and
        each LoRA's file found (or fetched once) for the model's experts, the request given them."""
        if request.settings.decoder == "fast":
            self.decoder.use_fast_decoder(resolved, self.host.loaded)
        elif request.settings.decoder == "vae_light":
            self.decoder.use_light_vae(resolved, self.host.loaded)
        check_step_files(self.host.models_dir, post_steps(request.settings.interpolate, request.settings.upscale))
        if not request.settings.loras:
            return request
        loras = lora_files(request.settings.loras, self.host.models_dir, resolved,
                           lambda: self.job.in_phase(Phase.DOWNLOAD))
        return replace(request, settings=replace(request.settings, loras=loras))

    # ----- load and denoise, stepping down --------------------------------------------
    def _denoise_stepping_down(self, resolved: ResolvedModel, plan: Plan, request: GenerationRequest):
        """(the loaded model, the denoised latents): out of memory before the decode frees everything and
        runs again one rung down the planner's ladder, until a rung works or none is left."""
        job = self.job
        while True:
            self.job.planned(plan, self._predict(resolved, plan, request))
            try:
                loaded, latents = self._load_and_denoise(resolved, plan, request)
                break
            except Exception as exc:
                if not is_out_of_memory(exc) or job.phase == "vae_decode" or not self.scope.steps_down:
                    raise
                lower = self._next_rung(request, resolved.spec, plan)
                if lower is None:
                    raise
                job.stepped_down(plan.strategy, lower.strategy)
                self.host.unload()
                plan = lower
        if job.step_downs:
            job.info(f"'{plan.strategy}' worked after stepping down from '{job.step_downs[0]['from']}'.")
        return loaded, latents

    def _next_rung(self, request: GenerationRequest, spec: ModelSpec, plan: Plan) -> Plan | None:
        """The plan one rung down the planner's ladder (the first lower rung that fits, else the next one)."""
        lower = [self.host.plan_for(request, spec, name) for name in rungs_below(spec, plan.strategy)]
        return next((p for p in lower if p.fits), lower[0] if lower else None)

    def _predict(self, resolved: ResolvedModel, plan: Plan, request: GenerationRequest):
        """The seconds each phase of this run should take (None until this machine has been measured)."""
        calibration = self.host.measure_machine(Path(request.outputs_dir), self.job)
        return self.host.timing.predict(resolved, plan, request, calibration, self._is_loaded(resolved, plan))

    def _load_and_denoise(self, resolved: ResolvedModel, plan: Plan, request: GenerationRequest):
        import torch

        job, host = self.job, self.host
        job.use_device(plan.device)
        loaded = host.load(resolved, plan, job)
        set_vae_tiling(loaded.pipe.vae, plan.vae_tile)
        denoiser = Denoiser(job, self.scope, loaded, request, host.models_dir, host.preview_seconds)
        denoiser.apply_speed()
        denoiser.apply_loras()
        job.check_cancel()
        with torch.inference_mode():
            with job.in_phase(Phase.TEXT_ENCODE):
                embeds = host.prompts.encode(loaded, request, job)
            image = denoiser.encode_image()
            video = denoiser.encode_video()
            job.check_cancel()
            with self.scope.denoising(transformers_of(denoiser.pipe), loaded.plan, job):
                latents = denoiser.denoise(embeds, image, video)
        return loaded, latents

    # ----- finish: save, decode, export, record ----------------------------------------
    def _finish(self, loaded: LoadedModel, request: GenerationRequest, latents) -> JobFinished:
        """Latents saved (so a failed decode costs no denoising), decoded, exported; the sidecar last."""
        job = self.job
        check_latents(loaded, request, latents)   # NaN latents: nothing to save or decode
        bundle = self._save_latents(loaded, request, latents)
        try:
            return self._made(loaded, request, latents, bundle)
        except Cancelled:
            self._discard(bundle, request)
            raise

    def _discard(self, bundle: Bundle, request: GenerationRequest) -> None:
        """What a run cancelled after its latents were saved (in the decode, a step after it, the join) wrote:
        removed, as a cancel keeps nothing new; only the latents (and the inputs kept for them) stay when the
        request asked to keep them."""
        keep = (bundle.latents, *(bundle.input(f) for f in (*INPUT_SUFFIXES, *VIDEO_INPUT_SUFFIXES))) \
            if request.keep_latents else ()
        for path in bundle.existing():
            if path not in keep:
                path.unlink(missing_ok=True)
        if not request.keep_latents:
            self.job.latents = None

    def _made(self, loaded: LoadedModel, request: GenerationRequest, latents, bundle: Bundle) -> JobFinished:
        """The saved latents decoded and exported, the steps after the decode and an extension's join run; the
        sidecar last."""
        job = self.job
        media, shape = self.decoder.decode_and_write(loaded, request, latents, bundle)
        if self.host.latents_hours <= 0 and not request.keep_latents:
            job.removed_latents()
        sidecar = self._write_sidecar(loaded, request, bundle, media, shape)   # kept as it is if a step fails
        steps = post_steps(request.settings.interpolate, request.settings.upscale)
        post, note = None, SELFTEST_NOTE if loaded.model.selftest else ""
        if steps:
            shape, post = self._post_steps(loaded, request, media, shape, steps)
            sidecar = self._write_sidecar(loaded, request, bundle, media, shape, post)
        if request.extend:
            from engine.post.extend import join_extension, joined_note

            shape, joined = join_extension(job, request, media)
            sidecar = self._write_sidecar(loaded, request, bundle, media, shape, post, joined)
            note = f"{joined_note(joined)} {note}".strip()
        self.host.timing.finished(loaded, request, job.timings, job.step_seconds, "load" not in job.timings,
                                  job.decoder, job.predicted.model_step_seconds if job.predicted else None,
                                  job.predicted.model_seconds if job.predicted else None)
        return JobFinished(job.id, (str(media),), str(sidecar), request.seed, dict(job.timings), peak_vram_gb(),
                           job.ram.peak_gb, note)

    def _save_latents(self, loaded: LoadedModel, request: GenerationRequest, latents) -> Bundle:
        """The output's bundle, its latents written (and an image-to-video run's inputs kept) before the decode."""
        job = self.job
        cleanup_latents(Path(request.outputs_dir), self.host.latents_hours)
        bundle = Bundle(output_stem(Path(request.outputs_dir), request.settings.mode, request.prompt, request.seed))
        with job.in_phase(Phase.SAVE_LATENTS, timed=False):
            if request.settings.mode in ("i2v", "v2v"):
                # The upload is a temporary file: keep a copy (before the decode, which may fail) so the run
                # can be repeated from the History tab, also after Decode again.
                job.kept_inputs(*keep_inputs(request, bundle.stem))
            job.saved_latents(save_latents(latents, bundle.latents, {
                "request": request.to_dict(), "model": {"ref": loaded.model.ref, "revision": loaded.model.revision},
                "strategy": loaded.plan.strategy, "keep": request.keep_latents, "inputs": job.inputs}))
        return bundle

    def _post_steps(self, loaded: LoadedModel, request: GenerationRequest, media: Path, shape: tuple, steps):
        """The steps after the decode (smoother, larger) on the written file, which their result replaces: (the
        file's new shape, the steps' records for the sidecar)."""
        job = self.job
        count, height, width = (int(n) for n in shape[:3])
        fps = request.settings.fps if request.settings.mode != "t2i" else None
        runner = StepRunner(self.host.models_dir, loaded.plan.device, job)
        dest = work_path(media, 0)
        try:
            made, records = run_steps(job, runner, steps, Media(media, count, width, height, fps), dest)
            replace_file(made.path, media)
        finally:
            dest.unlink(missing_ok=True)   # a step cancelled or failed part way
        return (made.frames, made.height, made.width, 3), [record.to_dict() for record in records]

    def _write_sidecar(self, loaded: LoadedModel, request: GenerationRequest, bundle: Bundle, media: Path,
                       shape: tuple, post: list | None = None, extend: dict | None = None) -> Path:
        job = self.job
        sidecar = run_record(request, media, shape, model=loaded.model, plan=loaded.plan.to_dict(),
                             step_downs=job.step_downs, latents=job.latents, decode_fallback=job.decode_fallback,
                             timings=job.timings, step_seconds=job.step_seconds, peak_ram_gb=job.ram.peak_gb,
                             hardware=self.host.hardware.to_dict(), inputs=job.inputs,
                             note=SELFTEST_NOTE if loaded.model.selftest else "",
                             speed=speed_record(loaded.plan, request, job), experts=job.experts,
                             windows=job.windows, post=post, extend=extend)
        return write_sidecar(sidecar, bundle.sidecar)


def speed_record(plan: Plan, request: GenerationRequest, job: Job) -> dict:
    """How the run was made fast, and whether any of it is approximate (the sidecar's "speed")."""
    cache = request.settings.step_cache
    decoder = "vae_fast" if job.decoder == "vae" and plan.channels_last else job.decoder
    return {"decoder": decoder, "step_cache": cache, "step_cache_detail": job.cache,
            "approximate": decoder != "vae" or bool(cache) or plan.fp8_compute,
            "compute": "fp8" if plan.fp8_compute else "exact",
            "vae_dtype": plan.vae_dtype, "conv": plan.conv, "decode_window": plan.decode_window,
            "compiled": plan.compile and not job.loras_beside,
            "loras": ("beside the weights" if job.loras_beside else "merged")
            if any(lora.strength for lora in request.settings.loras) else None,
            "attention": plan.attention_backend,
            "guidance_batch": plan.guidance_batch and request.settings.guidance > 1.0,
            "predicted_seconds": dict(job.predicted.seconds) if job.predicted is not None else None}


def check_model_fits_request(model: ResolvedModel, request: GenerationRequest) -> None:
    """InputError when the model cannot make what the request asks: its kind, its frames, its size, its experts
    (engine/settings/model_fit.py, the check the app made before queueing, now from the model's own files)."""
    info = ModelInfo(model.ref, model.spec, model.transformer_files)
    check_model_fits(info, request.settings, bool(request.last_image))
