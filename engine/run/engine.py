"""The Engine: what lives across jobs (the loaded model, the prompt encodings, the time plan, the hardware), and
the way in for every job.

A run reads like a pipeline: check, plan, load, encode text, encode image, denoise, decode, export
(engine/run/generation.py), each phase timed with the device synchronised and reported as typed events through
``emit`` (engine/run/job.py). Out of memory in a phase steps one rung down the planner's ladder and runs again;
out of memory in the decode retries the decode alone, tiled, then on the CPU (engine/run/decode_stage.py). A job
split across GPUs differs from a whole one only in its JobScope (engine/run/job_scope.py).
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Callable

from engine.device.compile_cache import compiled_sizes, remember_compiled
from engine.device.hardware import GIB, HardwareProfile, detect_hardware
from engine.device.runtime import release_memory, reset_peak_vram, trim_heap
from engine.events import DownloadProgress, Event, JobFinished, Phase
from engine.models.catalog import ModelCatalog
from engine.models.finite import check_transformer_values
from engine.models.refs import ResolvedModel, classify_ref
from engine.models.selftest import selftest_built
from engine.models.single_file import read_bytes
from engine.models.spec import TRANSFORMERS, ModelSpec
from engine.outputs.latents import DEFAULT_KEEP_HOURS
from engine.planning.planner import Plan, override_for, plan_memory, plan_request_for
from engine.run.apply_plan import (
    from_pretrained_kwargs,
    keep_encoder_exact,
    let_go_of_pipeline_files,
    load_into_ram,
    load_transformer_files,
    load_transformers,
    load_transformers_alone,
    loaded_into_ram,
    loads_transformers_alone,
    offload_to_disk,
    place_components,
    place_encoders,
    use_vae_dtype,
)
from engine.run.decode_stage import Decoder, SavedLatents
from engine.run.disk_offload import disk_offload_folder, disk_room_gb, remove_disk_offload
from engine.run.experts import ExpertSwap
from engine.run.faults import NO_FAULTS, PhaseHook
from engine.run.generation import SELFTEST_NOTE, Generation
from engine.run.job import Emit, Job
from engine.run.job_scope import JobScope, SplitJob, WholeJob
from engine.run.loaded import LoadedModel, reusing_image_embeds
from engine.run.parallel import RankGroup
from engine.run.preview import PREVIEW_EVERY_SECONDS
from engine.run.prompt_cache import PromptCache
from engine.run.time_plan import TimePlanner, calibration_enabled, with_fastest_attention
from engine.settings.request import GenerationRequest, check_request
from engine.settings.values import MODE_NAMES, InputError

# Named here too for the callers that know the Engine's module (the tests among them).
__all__ = ["SELFTEST_NOTE", "Engine", "LoadedModel", "reusing_image_embeds", "read_rate"]


def read_rate(nbytes: int) -> Callable[[float], str]:
    """The load phase's detail: how much it read, and how fast ("14.3 GB read at 5.2 GB/s")."""
    def words(seconds: float) -> str:
        if not nbytes or seconds <= 0:
            return ""
        gb, mb = nbytes / GIB, nbytes / 2 ** 20
        size = f"{gb:.1f} GB" if gb >= 0.1 else f"{mb:.1f} MB"
        rate = f"{gb / seconds:.2f} GB/s" if gb / seconds >= 0.1 else f"{mb / seconds:.1f} MB/s"
        return f"{size} read at {rate}"
    return words


class Engine:
    """At most one loaded pipeline and what else lives across jobs; each job is a Job run as a Generation (or a
    decode again through a Decoder), which asks the Engine for the model, the plan and the prompt encodings."""

    def __init__(self, models_dir: Path | str = "models", hardware: HardwareProfile | None = None,
                 latents_hours: float = DEFAULT_KEEP_HOURS, preview_seconds: float = PREVIEW_EVERY_SECONDS,
                 faults: PhaseHook = NO_FAULTS, calibrate: bool | None = None, outputs_dir: Path | str | None = None):
        self.models_dir = Path(models_dir)
        self._hardware = hardware
        # Where the app keeps its outputs, and this machine's measured rates beside them: an attention backend
        # measured in an earlier session is this engine's (and so the page's plan's) from the first probe on.
        self.outputs_dir = Path(outputs_dir) if outputs_dir else None
        self.loaded: LoadedModel | None = None
        # How long the latents of a finished run are kept (0: removed as soon as the video is written).
        self.latents_hours = latents_hours
        # Live previews while denoising: at most one every this many seconds (0: every step; negative: none).
        self.preview_seconds = preview_seconds
        # Called as each phase starts: nothing in the app; the tests' injected faults (engine/run/faults.py).
        self.faults = faults
        # Recent prompt encodings, kept on the CPU: a new seed with the same prompt skips the text encoder.
        self.prompts = PromptCache()
        # The models' specs and single transformer files, read once per version of their files (the app's own
        # catalog answers the same questions before a job is queued: engine/models/catalog.py).
        self.catalog = ModelCatalog()
        # The time plan: this machine's rates (measured once, kept beside the outputs) and the runs it has
        # seen, by model and plan, which correct the next predictions. None: measure when a job first needs it
        # (False: never; WAN_STUDIO_CALIBRATE=0 turns it off, as the test suite does).
        self.timing = TimePlanner(models_dir=self.models_dir, enabled=calibration_enabled(calibrate))

    # ----- the hardware and its calibration -----------------------------------------
    def use_hardware(self, hardware: HardwareProfile) -> None:
        """Plan for another hardware description from now on (the loaded model is dropped)."""
        self.unload()
        self._hardware = hardware

    @property
    def hardware(self) -> HardwareProfile:
        """This machine as the plan sees it: detected once, with the attention backend this machine's calibration
        measured fastest (when it was measured: now or in an earlier session, in the outputs folder)."""
        if self._hardware is None:
            self._hardware = detect_hardware()
            if self.outputs_dir is not None:
                self._use_calibration(self.timing.known(self.outputs_dir, self._hardware))
                self._hardware = replace(self._hardware, compiled_sizes=compiled_sizes(self.outputs_dir))
        return self._hardware

    def _remember_compiled(self, request: GenerationRequest) -> None:
        """A run whose transformer ran compiled: its size is in the app's compile cache from now on (the plans of
        this process and of later ones compile it again for fewer passes: engine/planning/speed.py)."""
        from engine.planning.speed import compile_key
        from engine.run.speedups import is_compiled

        if self.outputs_dir is None or self.loaded is None or not is_compiled(self.loaded.pipe.transformer):
            return
        s, hardware = request.settings, self.hardware
        key = compile_key(self.loaded.model.spec, s.width, s.height, s.frames, s.window, s.mode == "i2v",
                          hardware.device_name, hardware.torch_version)
        if key not in hardware.compiled_sizes:
            self._hardware = replace(hardware, compiled_sizes=remember_compiled(self.outputs_dir, key))

    def _use_calibration(self, calibration) -> None:
        self._hardware = with_fastest_attention(self._hardware, calibration)

    def measure_machine(self, outputs_dir: Path, job: Job):
        """This machine's rates (measured once, as a timed phase of the first job); the fastest attention
        backend measured among them becomes the hardware's, which the plan picks."""
        calibration = self.timing.calibration(outputs_dir, self.hardware, lambda work: job.timed("calibrate", work))
        self._use_calibration(calibration)
        return calibration

    # ----- the loaded model ---------------------------------------------------------
    def unload(self) -> None:
        """Drop the loaded pipeline and give its memory back: the device's, and its RAM (pinned RAM too) to the
        system."""
        if self.loaded is not None:
            pipe = self.loaded.pipe
            self.loaded = None
            if hasattr(pipe, "remove_all_hooks"):
                pipe.remove_all_hooks()
            del pipe
        release_memory()
        remove_disk_offload(self.models_dir)   # a disk plan's copy of the transformer

    def resolve(self, ref: str, job: Job, vet=None) -> ResolvedModel:
        """The model ``ref`` names: the loaded one's, or resolved (downloaded or built first, in its own phase);
        ``vet``: the job's checks of a Hub model before its weights download (ModelCatalog.resolve)."""
        if self.loaded is not None and self.loaded.model.ref == ref:
            return self.loaded.model
        kind = classify_ref(ref)
        if kind == "hub":
            def progress(done, total, unit):
                job.emit(DownloadProgress(job.id, done, total, unit))
            with job.in_phase(Phase.DOWNLOAD):
                return self.catalog.resolve(ref, self.models_dir, progress, vet)
        if kind == "selftest" and not selftest_built(ref, self.models_dir):
            with job.in_phase(Phase.BUILD_MODEL):   # the first use on this machine builds and saves it
                return self.catalog.resolve(ref, self.models_dir)
        return self.catalog.resolve(ref, self.models_dir)

    def load(self, resolved: ResolvedModel, plan: Plan, job: Job) -> LoadedModel:
        """``resolved`` loaded with ``plan``: the model loaded now when it is the same with the same plan, else
        the old one unloaded and this one loaded and placed (timed phases load and transfer)."""
        if self.loaded is not None:
            if self.loaded.model.ref == resolved.ref and self.loaded.plan.reload_key == plan.reload_key:
                job.info(f"Model {resolved.ref} is already loaded with this plan: no load needed.")
                if self.loaded.plan.text_encoder != plan.text_encoder:
                    with job.in_phase(Phase.TRANSFER):
                        place_encoders(self.loaded.pipe, plan)
                if self.loaded.plan.vae_dtype != plan.vae_dtype:   # the VAE alone, in the other precision
                    job.info(f"The VAE is read again in {plan.vae_dtype}; the rest of the model stays loaded.")
                    with job.in_phase(Phase.TRANSFER):
                        use_vae_dtype(self.loaded.pipe, resolved.folder, plan)
                    # What was made over the old VAE goes with it (the image-to-video pipeline, the preview's map).
                    self.loaded.image_pipe = self.loaded.preview_map = None
                self.loaded.plan = plan
                return self.loaded
            # No local reference to the old pipeline may survive this point: it would stay in
            # memory beside the new one while that loads.
            old = self.loaded.model.ref
            same_files = self.loaded.plan.transformer_files == plan.transformer_files
            why = resolved.ref if old != resolved.ref else ("a different memory strategy" if same_files
                                                            else "another transformer file")
            job.info(f"Unloading {old} to make room for {why}.")
            self.unload()
        with job.in_phase(Phase.LOAD) as phase:
            check_transformer_values(resolved.transformer_files)   # sampled: a damaged file refused before it loads
            pipe = self._from_pretrained(resolved, plan)
            nbytes = read_bytes(resolved)
            phase.detail = read_rate(nbytes)
        self.timing.loaded(nbytes, job.timings.get("load", 0.0))
        with job.in_phase(Phase.TRANSFER):
            place_components(pipe, plan)
            experts = ExpertSwap.place(pipe, plan.device, plan.pin_memory) if plan.swaps_experts else None
            keep_encoder_exact(pipe, resolved.folder)
            # Weights cast on the CPU (from float32 files) and now on the device leave their RAM in the C library's
            # heap: a 1.3B transformer's 2.6 GiB stayed in the engine's RAM after its transfer (an H100's run,
            # docs/models.md) until given back.
            trim_heap()
        self.loaded = LoadedModel(resolved, pipe, plan, dict(pipe.scheduler.config), experts=experts)
        return self.loaded

    def _from_pretrained(self, resolved: ResolvedModel, plan: Plan):
        import diffusers

        pipeline_class = getattr(diffusers, resolved.kind.runs_as)
        gate = resolved.spec.transformer.gate if resolved.spec is not None else ""
        in_ram = load_into_ram(resolved.folder, loaded_into_ram(plan), plan) | load_transformer_files(resolved, plan)
        if plan.transformer == "disk":   # each transformer alone first, to its files, before the rest takes RAM
            in_ram = load_transformers(resolved.folder, plan, in_ram, gate)
            folder = disk_offload_folder(self.models_dir, fresh=True)
            for name in TRANSFORMERS:
                if name in in_ram:
                    offload_to_disk(in_ram[name], plan, folder / name)
        if loads_transformers_alone(resolved.spec, plan):   # FastWan's gate kept; wide files let go of one by one
            in_ram |= load_transformers_alone(resolved.folder, plan, gate, in_ram)
        pipe = pipeline_class.from_pretrained(resolved.folder, **from_pretrained_kwargs(plan), **in_ram)
        pipe.set_progress_bar_config(disable=True)  # progress goes out as events instead
        let_go_of_pipeline_files(pipe)
        return pipe

    # ----- planning ---------------------------------------------------------
    def plan_for(self, request: GenerationRequest, spec: ModelSpec, strategy: str | None = None,
                 ranks: int = 1) -> Plan:
        """The memory plan for ``request``; ``ranks`` > 1: for one of that many GPUs sharing the denoise."""
        settings = request.settings
        override = replace(override_for(settings), strategy=strategy or settings.strategy)
        hardware = replace(self.hardware, disk_free_gb=disk_room_gb(self.models_dir))
        wanted = replace(plan_request_for(settings), ranks=ranks, extends=bool(request.extend))
        return plan_memory(spec, wanted, hardware, override)

    # ----- jobs ---------------------------------------------------------------
    def run(self, request: GenerationRequest, job_id: str, emit: Emit,
            should_cancel: Callable[[], bool] = lambda: False, timings: dict | None = None,
            group: RankGroup | None = None) -> Event:
        """Run one job to a terminal event (finished, cancelled or failed), which is also emitted.

        ``timings``: phases the job went through before it reached the engine (its wait for the engine
        process to start), counted in its total and its sidecar. ``group``: this engine's rank in a job split
        across GPUs (engine/run/parallel.py); ranks other than 0 end with RankDone after the denoise."""
        mode = request.settings.mode
        job = Job(job_id, emit, should_cancel, self.faults, timings, steps=request.settings.denoise_steps)
        scope: JobScope = WholeJob() if group is None else SplitJob(group, self.hardware.device)

        def generate() -> Event:
            checked = request if request.checked else check_request(request)   # the worker client checked it once
            return self._videos(checked, job, scope)

        return job.run_to_end(scope.title(f"{MODE_NAMES.get(mode, mode)} with {request.settings.model}"),
                              lambda: scope.running(generate), self._model_loaded)

    def _videos(self, request: GenerationRequest, job: Job, scope: JobScope) -> Event:
        """The request's ``count`` outputs, one after the other on the loaded model (the prompt encoded once):
        seeds seed, seed + 1, ... (each random with -1), each its own output and sidecar; one finished event for
        them all. A cancel stops the rest; what was written stays."""
        count = request.settings.count
        if count > 1 and scope.ranks > 1:
            raise InputError(f"several videos in one job (count {count}) run on one GPU: ask for 1 GPU, or make "
                             "them one at a time")
        finished = [Generation(self, job, scope).run(request)]
        if isinstance(finished[0], JobFinished):
            self._remember_compiled(request)
        for video in range(2, count + 1):
            if not isinstance(finished[-1], JobFinished):   # a split job's other rank
                return finished[-1]
            job.next_video(finished[-1], video, count)
            seed = (request.seed + video - 1) % 2**32 if request.seed >= 0 else -1
            finished.append(Generation(self, job, scope).run(replace(request, seed=seed)))
        return finished[0] if count == 1 else all_finished(finished)

    def decode_saved(self, path: str, job_id: str, emit: Emit, tiled: bool = False, on_cpu: bool = False,
                     timings: dict | None = None, should_cancel: Callable[[], bool] = lambda: False) -> Event:
        """Decode saved latents into a new video (no denoising); the terminal event is also emitted."""
        job = Job(job_id, emit, should_cancel, self.faults, timings)
        return job.run_to_end(f"decode again from {Path(path).name}",
                              lambda: self._decode_saved(Path(path), job, tiled, on_cpu), self._model_loaded,
                              decoding=str(path))

    def _decode_saved(self, path: Path, job: Job, tiled: bool, on_cpu: bool) -> Event:
        """Saved latents decoded with their model's VAE: the loaded model's, else the VAE alone."""
        saved = SavedLatents.read(path)
        reset_peak_vram()
        resolved = self.resolve(saved.request.settings.model, job)
        decoder = Decoder(job, self.models_dir)
        loaded = self.loaded if self.loaded is not None and self.loaded.model.ref == resolved.ref else None
        parts = decoder.vae_for(resolved, loaded)
        plan = self.plan_for(saved.request, resolved.spec)
        return decoder.decode_saved(saved, parts, plan, tiled, on_cpu, self.hardware.to_dict())

    def post_output(self, path: str, step: str, factor: int, job_id: str, emit: Emit,
                    should_cancel: Callable[[], bool] = lambda: False, timings: dict | None = None) -> Event:
        """Smoother or larger on an output already made (engine/post/on_output.py): a new output beside it."""
        from engine.post.on_output import post_on_output
        from engine.post.steps import PostStep

        job = Job(job_id, emit, should_cancel, self.faults, timings)
        post = PostStep(step, factor)
        return job.run_to_end(f"{post.title} from {Path(path).name}", lambda: post_on_output(
            job, Path(path), post, self.models_dir, self.hardware.device), self._model_loaded)

    def _model_loaded(self) -> bool:
        return self.loaded is not None


def all_finished(finished: list[JobFinished]) -> JobFinished:
    """One finished event for a job's several outputs: each one's path, seed and sidecar in order, the phases'
    seconds summed, the peaks the highest."""
    timings: dict = {}
    for done in finished:
        for phase, seconds in done.timings.items():
            timings[phase] = round(timings.get(phase, 0.0) + seconds, 4)
    vram = [done.peak_vram_gb for done in finished if done.peak_vram_gb is not None]
    ram = [done.peak_ram_gb for done in finished if done.peak_ram_gb is not None]
    # The first video's seed and sidecar: the one the page shows, and the first of the paths.
    return replace(finished[0], paths=tuple(p for done in finished for p in done.paths), timings=timings,
                   peak_vram_gb=max(vram) if vram else None, peak_ram_gb=max(ram) if ram else None,
                   seeds=tuple(done.seed for done in finished), sidecars=tuple(done.sidecar for done in finished))
