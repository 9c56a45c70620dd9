"""The Engine: owns at most one loaded pipeline and runs generation jobs as timed phases.

A run reads like a pipeline: check, plan, load, encode text, encode image,
denoise, decode, export. Each phase is timed with the device synchronised
and reported as typed events through ``emit``. Out of memory in a phase
steps one rung down the planner's ladder and runs again; out of memory in
the decode retries the decode alone, tiled, then on the CPU.
"""
from __future__ import annotations

import secrets
import traceback
from collections import OrderedDict
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from engine.device.hardware import GIB, HardwareProfile, detect_hardware
from engine.device.runtime import RamPeakSampler, clock, peak_vram_gb, release_memory, reset_peak_vram, synchronize
from engine.events import (
    DownloadProgress,
    Event,
    Info,
    JobCancelled,
    JobFailed,
    JobFinished,
    JobStarted,
    LatentsSaved,
    PhaseFinished,
    PhaseStarted,
    PlanReady,
    RankDone,
    StepFinished,
)
from engine.models.finite import check_transformer_values
from engine.models.limits import check_model_limits, limits_of
from engine.models.refs import ResolvedModel, classify_ref, resolve_model
from engine.models.selftest import selftest_built
from engine.models.single_file import read_bytes, use_transformer_files
from engine.models.spec import TEXT_TOKENS, TRANSFORMERS, ModelSpec
from engine.outputs.bundle import Bundle
from engine.outputs.export import output_stem
from engine.outputs.kept_inputs import keep_inputs
from engine.outputs.latents import DECODE_AGAIN_HINT, DEFAULT_KEEP_HOURS, cleanup_latents, save_latents
from engine.outputs.record import run_record
from engine.outputs.sidecar import write_sidecar
from engine.planning.planner import Plan, override_for, plan_memory, plan_request_for, rungs_below
from engine.run.apply_plan import (
    encoder_device,
    encoder_visiting,
    from_pretrained_kwargs,
    keep_encoder_exact,
    load_into_ram,
    load_transformer_files,
    load_transformers,
    loaded_into_ram,
    offload_to_disk,
    place_components,
    place_encoders,
    set_vae_tiling,
    torch_dtype,
)
from engine.run.clip_input import clip_image_embeds
from engine.run.decode_stage import DecodeStage
from engine.run.disk_offload import disk_offload_folder, disk_room_gb, remove_disk_offload
from engine.run.experts import ExpertSwap, switch_step
from engine.run.failures import failure_event, is_out_of_memory
from engine.run.faults import NO_FAULTS, PhaseHook
from engine.run.lora import lora_files
from engine.run.parallel import GateCancelled, PeerStopped, RankGroup, SplitSession
from engine.run.preview import PREVIEW_EVERY_SECONDS, DecoderPreview, LivePreview, PreviewMap, preview_map_for
from engine.run.schedulers import make_scheduler
from engine.run.step_clock import FirstPass, transformers_of
from engine.run.time_plan import TimePlanner, calibration_enabled, with_fastest_attention
from engine.settings.request import GenerationRequest, check_request
from engine.settings.values import MODE_NAMES, InputError, check_experts

SELFTEST_NOTE = "Noise from a self-test model: random weights, made to check the app works, not to look like anything."
PROMPT_CACHE_SIZE = 4   # encodings are 512 x 4096 x 2 bytes each: 4 MB
CALIBRATION_FOLDER = ".calibration"   # in the models folder: MagCache's ratios per model and step count
Emit = Callable[[Event], None]


def read_rate(nbytes: int) -> Callable[[float], str]:
    """The load phase's detail: how much it read, and how fast ("14.3 GB read at 5.2 GB/s")."""
    def words(seconds: float) -> str:
        if not nbytes or seconds <= 0:
            return ""
        gb = nbytes / GIB
        size = f"{gb:.1f} GB" if gb >= 0.1 else f"{nbytes / 2 ** 20:.1f} MB"
        return f"{size} read at {gb / seconds:.2f} GB/s"
    return words


class Cancelled(Exception):
    """The user asked to stop; raised at a step or phase boundary."""


@dataclass
class LoadedModel:
    model: ResolvedModel
    pipe: object
    plan: Plan
    scheduler_config: dict
    preview_map: PreviewMap | None = None   # latent -> RGB for live previews, made at the first one
    image_pipe: object = None   # Wan2.2 TI2V-5B's image-to-video pipeline, over the same components
    fast_decoders: dict = field(default_factory=dict)   # file -> its FastDecoder, loaded at first use
    experts: ExpertSwap | None = None   # Wan2.2 A14B with one expert on the device at a time (the plan's swap)

    def for_mode(self, mode: str):
        """The pipeline that runs ``mode``: the loaded one or, for image to video with a text-and-image model
        (Wan2.2 TI2V-5B), an image-to-video pipeline made once over the same components: nothing is
        loaded or copied, and every hook the plan applied stays on them."""
        if mode != "i2v" or self.model.image_to_video:
            return self.pipe
        if self.image_pipe is None:
            from diffusers import WanImageToVideoPipeline

            parts = {name: getattr(self.pipe, name, None)
                     for name in ("tokenizer", "text_encoder", "vae", "scheduler", "transformer", "transformer_2")}
            self.image_pipe = WanImageToVideoPipeline(**parts, boundary_ratio=self.pipe.config.get("boundary_ratio"),
                                                      expand_timesteps=True)
            self.image_pipe.set_progress_bar_config(disable=True)
            keep_encoder_exact(self.image_pipe, self.model.folder)
        return self.image_pipe


@dataclass(frozen=True)
class ImageInputs:
    """What an image-to-video run gives the pipeline besides the prompt: the first frame and the optional last
    frame, fitted to the video's size, and their encoding when the model has an image encoder (made in the
    timed image_encode phase from the whole frames, as the official Wan code makes it, not diffusers' centre crop:
    engine/run/clip_input.py; None otherwise). Empty for the other modes."""
    image: object = None
    last_image: object = None
    embeds: object = None

    def pipe_inputs(self) -> dict:
        """The pipeline call's image arguments (none without an image)."""
        return {} if self.image is None else {"image": self.image, "last_image": self.last_image}


@contextmanager
def reusing_image_embeds(pipe, embeds):
    """While this block runs, ``pipe.encode_image`` returns ``embeds`` instead of running the image encoder.

    Why: the image encoder already ran in its own timed phase (image_encode), and Wan's image-to-video
    pipeline refuses ``image`` and ``image_embeds`` together, yet needs the image for its latents; so the
    pipeline is given the image and this encoding is handed to it here. Afterwards ``pipe`` is as it was, also
    when the call raises (cancelled, out of memory): the loaded pipeline serves later runs, which encode their
    own images. ``embeds`` None: nothing is changed.
    """
    if embeds is None:
        yield
        return
    own = vars(pipe).get("encode_image")   # an instance attribute of its own (normally none: the class method)
    pipe.encode_image = lambda *args, **kwargs: embeds
    try:
        yield
    finally:
        if own is None:
            del pipe.encode_image
        else:
            pipe.encode_image = own


@dataclass
class _PhaseNote:
    """What a phase did, for its row on the page: words, or a function of the phase's seconds that gives them."""
    detail: str | Callable[[float], str] = ""


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
    step_downs: list = field(default_factory=list)
    decode_fallback: str | None = None
    latents: str | None = None
    inputs: dict | None = None          # input images kept beside the output: {field: file name or None}
    ram: RamPeakSampler | None = None   # the run's RAM peak so far, reported with every step
    steps: int = 0                      # denoising steps the job asks for (none for a decode again)
    fast_decoder: Path | None = None    # the fast decoder's file, when the job decodes with it
    decoder: str = "vae"                # what made the frames: "vae" or "fast (<file stem>)"
    cache: str | None = None            # the step cache's own account of what it did, when one was on
    predicted: object = None            # the time plan's PhaseTimes for this run, when the machine is measured
    experts: dict | None = None         # Wan2.2 A14B: the steps each expert ran, the switch step (the sidecar's)
    open_phases: list = field(default_factory=list)   # the phases running now, outermost first
    split: SplitSession | None = None   # this engine's part in a job split across GPUs (None: the whole job)
    nested_seconds: float = 0.0         # seconds of the phases run inside others, for those to leave out
    loras_beside: bool = False          # its LoRAs compute beside the weights (not merged): uncompiled


class Engine(DecodeStage):
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
        self._prompt_cache: OrderedDict[tuple, tuple] = OrderedDict()
        # The time plan: this machine's rates (measured once, kept beside the outputs) and the runs it has
        # seen, by model and plan, which correct the next predictions. None: measure when a job first needs it
        # (False: never; WAN_STUDIO_CALIBRATE=0 turns it off, as the test suite does).
        self.timing = TimePlanner(models_dir=self.models_dir, enabled=calibration_enabled(calibrate))

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
        return self._hardware

    def _use_calibration(self, calibration) -> None:
        self._hardware = with_fastest_attention(self._hardware, calibration)

    # ----- model management -------------------------------------------------
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

    @contextmanager
    def _phase(self, job: _Job, name: str):
        """One phase of ``job``: announced, offered to the fault hook, then timed with the device synchronised.
        The block may say what the phase did by setting the yielded note's ``detail``. A phase run inside another
        (the expert swap, inside the denoise) is left out of that one's seconds, which then goes on."""
        job.phase = name
        job.emit(PhaseStarted(job.id, name))
        self.faults.before_phase(name)
        synchronize(job.device)
        start, nested = clock(), job.nested_seconds
        note = _PhaseNote()
        job.open_phases.append(name)
        try:
            yield note
        finally:
            job.open_phases.pop()
        synchronize(job.device)
        elapsed = clock() - start
        seconds = elapsed - (job.nested_seconds - nested)
        job.nested_seconds = nested + elapsed
        if job.open_phases:
            job.phase = job.open_phases[-1]
        job.timings[name] = round(job.timings.get(name, 0.0) + seconds, 4)
        detail = note.detail(seconds) if callable(note.detail) else note.detail
        job.emit(PhaseFinished(job.id, name, seconds, detail))

    def _resolve(self, ref: str, job: _Job) -> ResolvedModel:
        if self.loaded is not None and self.loaded.model.ref == ref:
            return self.loaded.model
        kind = classify_ref(ref)
        if kind == "hub":
            def progress(done, total, unit):
                job.emit(DownloadProgress(job.id, done, total, unit))
            with self._phase(job, "download"):
                return resolve_model(ref, self.models_dir, progress)
        if kind == "selftest" and not selftest_built(ref, self.models_dir):
            with self._phase(job, "build_model"):   # the first use on this machine builds and saves it
                return resolve_model(ref, self.models_dir)
        return resolve_model(ref, self.models_dir)

    def _ensure_loaded(self, resolved: ResolvedModel, plan: Plan, job: _Job) -> LoadedModel:
        if self.loaded is not None:
            if self.loaded.model.ref == resolved.ref and self.loaded.plan.reload_key == plan.reload_key:
                job.emit(Info(job.id, f"Model {resolved.ref} is already loaded with this plan: no load needed."))
                if self.loaded.plan.text_encoder != plan.text_encoder:
                    with self._phase(job, "transfer"):
                        place_encoders(self.loaded.pipe, plan)
                self.loaded.plan = plan
                return self.loaded
            # No local reference to the old pipeline may survive this point: it would stay in
            # memory beside the new one while that loads.
            old = self.loaded.model.ref
            same_files = self.loaded.plan.transformer_files == plan.transformer_files
            why = resolved.ref if old != resolved.ref else ("a different memory strategy" if same_files
                                                            else "another transformer file")
            job.emit(Info(job.id, f"Unloading {old} to make room for {why}."))
            self.unload()
        with self._phase(job, "load") as phase:
            check_transformer_values(resolved.transformer_files)   # sampled: a damaged file refused before it loads
            pipe = self._from_pretrained(resolved, plan)
            nbytes = read_bytes(resolved)
            phase.detail = read_rate(nbytes)
        self.timing.loaded(nbytes, job.timings.get("load", 0.0))
        with self._phase(job, "transfer"):
            place_components(pipe, plan)
            experts = ExpertSwap.place(pipe, plan.device, plan.pin_memory) if plan.swaps_experts else None
            keep_encoder_exact(pipe, resolved.folder)
        self.loaded = LoadedModel(resolved, pipe, plan, dict(pipe.scheduler.config), experts=experts)
        return self.loaded

    def _from_pretrained(self, resolved: ResolvedModel, plan: Plan):
        import diffusers

        pipeline_class = getattr(diffusers, resolved.pipeline_class)
        in_ram = load_into_ram(resolved.folder, loaded_into_ram(plan), plan) | load_transformer_files(resolved, plan)
        if plan.transformer == "disk":   # each transformer alone first, to its files, before the rest takes RAM
            in_ram = load_transformers(resolved.folder, plan, in_ram)
            folder = disk_offload_folder(self.models_dir, fresh=True)
            for name in TRANSFORMERS:
                if name in in_ram:
                    offload_to_disk(in_ram[name], plan, folder / name)
        pipe = pipeline_class.from_pretrained(resolved.folder, **from_pretrained_kwargs(plan), **in_ram)
        pipe.set_progress_bar_config(disable=True)  # progress goes out as events instead
        return pipe

    # ----- planning ---------------------------------------------------------
    def plan_for(self, request: GenerationRequest, spec: ModelSpec, strategy: str | None = None,
                 ranks: int = 1) -> Plan:
        """The memory plan for ``request``; ``ranks`` > 1: for one of that many GPUs sharing the denoise."""
        settings = request.settings
        override = replace(override_for(settings), strategy=strategy or settings.strategy)
        hardware = replace(self.hardware, disk_free_gb=disk_room_gb(self.models_dir))
        return plan_memory(spec, replace(plan_request_for(settings), ranks=ranks), hardware, override)

    def _next_rung(self, request: GenerationRequest, spec: ModelSpec, plan: Plan) -> Plan | None:
        """The plan one rung down the planner's ladder (the first lower rung that fits, else the next one)."""
        lower = [self.plan_for(request, spec, name) for name in rungs_below(spec, plan.strategy)]
        return next((p for p in lower if p.fits), lower[0] if lower else None)

    # ----- one run ----------------------------------------------------------
    def run(self, request: GenerationRequest, job_id: str, emit: Emit,
            should_cancel: Callable[[], bool] = lambda: False, timings: dict | None = None,
            group: RankGroup | None = None) -> Event:
        """Run one job to a terminal event (finished, cancelled or failed), which is also emitted.

        ``timings``: phases the job went through before it reached the engine (its wait for the engine
        process to start), counted in its total and its sidecar. ``group``: this engine's rank in a job split
        across GPUs (engine/run/parallel.py); ranks other than 0 end with RankDone after the denoise."""
        mode = request.settings.mode
        job = _Job(job_id, emit, should_cancel, timings=dict(timings or {}), steps=request.settings.steps)
        title = f"{MODE_NAMES.get(mode, mode)} with {request.settings.model}"
        if group is None:
            return self._envelope(job, title, lambda: self._generate(request, job))
        job.split = SplitSession(group, self.hardware.device)
        return self._envelope(job, f"{title}, part {group.rank + 1} of {group.size} (split across GPUs)",
                              lambda: self._generate_split(request, job))

    def decode_saved(self, path: str, job_id: str, emit: Emit, tiled: bool = False, on_cpu: bool = False,
                     timings: dict | None = None) -> Event:
        """Decode saved latents into a new video (no denoising); the terminal event is also emitted."""
        job = _Job(job_id, emit, lambda: False, timings=dict(timings or {}))
        return self._envelope(job, f"decode again from {Path(path).name}",
                              lambda: self._decode_saved(Path(path), job, tiled, on_cpu), decoding=str(path))

    def _envelope(self, job: _Job, title: str, work: Callable[[], Event], decoding: str | None = None) -> Event:
        """One job from its start to exactly one terminal event, emitted and returned: ``work``'s result, or
        the cancel or failure that ended it; the RAM peak is sampled all along. ``decoding``: the saved
        latents a decode-again job decodes (a failure names them, to try again)."""
        job.emit(JobStarted(job.id, title))
        job.ram = RamPeakSampler()
        try:
            with job.ram.running():
                result = work()
        except (Cancelled, GateCancelled):
            result = JobCancelled(job.id, len(job.step_seconds), job.steps, job.phase, self.loaded is not None)
        except PeerStopped as exc:
            result = JobFailed(job.id, f"{exc}.", "See the other GPU's failure.", job.phase, "peer")
        except Exception as exc:  # every failure reaches the page as an event
            result = failure_event(job.id, exc, job.phase)
            if result.kind == "runtime":   # a fault, not a user's mistake: its traceback goes to the console
                traceback.print_exc()
            if decoding:
                result = replace(result, latents=decoding)
            elif job.latents:   # saved before it failed: they can be decoded again
                result = replace(result, latents=job.latents,
                                 hint=" ".join(filter(None, (result.hint, DECODE_AGAIN_HINT))))
        job.emit(result)
        return result

    def _generate_split(self, request: GenerationRequest, job: _Job) -> Event:
        """This engine's part of a split job: run it (``_generate`` joins the job's group once the job is known to
        split), leave the group whatever happens. A failure or cancel before the denoise tells the other ranks at
        once (they stop too)."""
        split = job.split
        try:
            return self._generate(request, job)
        except (Cancelled, GateCancelled):
            split.stop(f"cancel:{split.group.rank}")
            raise
        except Exception as exc:
            split.stop(f"fail:{split.group.rank}:{str(exc)[:200] or type(exc).__name__}")
            raise
        finally:
            split.close()

    @staticmethod
    def _join_split(plan: Plan, job: _Job) -> None:
        """Refuse a split the plan says cannot work (every rank refuses alike, before any heavy work and before
        waiting for the others), else join the job's process group."""
        if not plan.split.possible:
            raise InputError(f"this job cannot be split across {plan.split.ranks} GPUs: {plan.split.reason}")
        split = job.split
        split.open()
        job.emit(Info(job.id, f"GPU rank {split.group.rank} of {split.group.size} joined the split job "
                              f"({plan.split.kind}, over {split.backend}) in {split.opened_seconds:.2f} s."))

    def _check_cancel(self, job: _Job) -> None:
        if job.should_cancel():
            raise Cancelled()

    def _generate(self, request: GenerationRequest, job: _Job) -> JobFinished:
        """Check, resolve and plan; load and denoise (stepping down on out of memory); then finish."""
        if not request.checked:   # the worker client checked it already: once per job is enough
            request = check_request(request)
        reset_peak_vram()
        # The settings' transformer files, read and checked against the model before anything loads.
        resolved = use_transformer_files(self._resolve(request.settings.model, job), request.settings)
        self._check_model_fits_request(resolved, resolved.spec, request)
        self._measure_machine(request, job)
        plan = self.plan_for(request, resolved.spec, ranks=job.split.group.size if job.split else 1)
        if job.split:
            self._join_split(plan, job)
        elif request.settings.gpus > 1:
            job.emit(Info(job.id, f"The settings ask for {request.settings.gpus} GPUs, but this engine was given the "
                                  "whole job: it runs on one GPU."))
        if not plan.fits and not request.settings.strategy:
            raise InputError("this request does not fit this machine's memory. " + " ".join(plan.suggestions))
        # The same seed on every rank of a split job, so each starts from the same noise.
        random = job.split.group.shared_seed() if job.split else secrets.randbelow(2**32)
        request = replace(request, seed=request.seed if request.seed >= 0 else random)
        if request.settings.decoder == "fast":   # found (or fetched) before any heavy work
            job.fast_decoder = self._fast_decoder_file(resolved, job)
        if request.settings.loras:   # each file found (or fetched once), for the model's experts, before any load
            request = replace(request, settings=replace(request.settings, loras=lora_files(
                request.settings.loras, self.models_dir, resolved, lambda: self._phase(job, "download"))))
        loaded, latents = self._denoise_stepping_down(resolved, plan, request, job)
        if job.split and not job.split.group.lead:
            group = job.split.group
            return RankDone(job.id, group.rank, group.size, len(job.step_seconds), dict(job.timings), peak_vram_gb())
        return self._finish(loaded, request, latents, job)

    def _denoise_stepping_down(self, resolved: ResolvedModel, plan: Plan, request: GenerationRequest, job: _Job):
        """(the loaded model, the denoised latents): out of memory before the decode frees everything and
        runs again one rung down the planner's ladder, until a rung works or none is left."""
        while True:
            self._announce(plan, job, self._predict(resolved, plan, request, job))
            try:
                loaded, latents = self._load_and_denoise(resolved, plan, request, job)
                break
            except Exception as exc:
                # A split job's ranks cannot step down alone: the others would wait in the denoise for it.
                if not is_out_of_memory(exc) or job.phase == "vae_decode" or job.split:
                    raise
                lower = self._next_rung(request, resolved.spec, plan)
                if lower is None:
                    raise
                job.emit(Info(job.id, f"Out of memory during {job.phase.replace('_', ' ')} with '{plan.strategy}': "
                                      f"freeing memory and stepping down to '{lower.strategy}'."))
                job.step_downs.append({"phase": job.phase, "from": plan.strategy, "to": lower.strategy})
                job.step_seconds.clear()
                self.unload()
                plan = lower
        if job.step_downs:
            job.emit(Info(job.id, f"'{plan.strategy}' worked after stepping down from "
                                  f"'{job.step_downs[0]['from']}'."))
        return loaded, latents

    def _finish(self, loaded: LoadedModel, request: GenerationRequest, latents, job: _Job) -> JobFinished:
        """Latents saved (so a failed decode costs no denoising), decoded, exported; the sidecar last."""
        self._check_latents(loaded, request, latents)   # NaN latents: nothing to save or decode
        bundle = self._save_latents(loaded, request, latents, job)
        media, shape = self._decode_and_write(loaded, request, latents, bundle, job)
        if self.latents_hours <= 0 and not request.keep_latents:
            Path(job.latents).unlink(missing_ok=True)
            job.latents = None
        sidecar = self._write_sidecar(loaded, request, job, bundle, media, shape)
        self.timing.finished(loaded, request, job.timings, job.step_seconds, "load" not in job.timings, job.decoder)
        return JobFinished(job.id, (str(media),), str(sidecar), request.seed, dict(job.timings), peak_vram_gb(),
                           job.ram.peak_gb, SELFTEST_NOTE if loaded.model.selftest else "")

    def _save_latents(self, loaded: LoadedModel, request: GenerationRequest, latents, job: _Job) -> Bundle:
        """The output's bundle, its latents written (and an image-to-video run's inputs kept) before the decode."""
        cleanup_latents(Path(request.outputs_dir), self.latents_hours)
        bundle = Bundle(output_stem(Path(request.outputs_dir), request.settings.mode, request.prompt, request.seed))
        job.phase = "saving latents"
        if request.settings.mode == "i2v":
            # The upload is a temporary file: keep a copy (before the decode, which may fail) so the run
            # can be repeated from the History tab, also after Decode again.
            job.inputs, problems = keep_inputs(request, bundle.stem)
            for problem in problems:
                job.emit(Info(job.id, problem))
        job.latents = str(save_latents(latents, bundle.latents, {
            "request": request.to_dict(), "model": {"ref": loaded.model.ref, "revision": loaded.model.revision},
            "strategy": loaded.plan.strategy, "keep": request.keep_latents, "inputs": job.inputs}))
        job.emit(LatentsSaved(job.id, job.latents))
        return bundle

    def _predict(self, resolved: ResolvedModel, plan: Plan, request: GenerationRequest, job: _Job):
        """The seconds each phase of this run should take (None until this machine has been measured)."""
        loaded = (self.loaded is not None and self.loaded.model.ref == resolved.ref
                  and self.loaded.plan.reload_key == plan.reload_key)
        calibration = self._measure_machine(request, job)
        job.predicted = self.timing.predict(resolved, plan, request, calibration, loaded)
        return job.predicted

    def _measure_machine(self, request: GenerationRequest, job: _Job):
        """This machine's rates (measured once, as a timed phase of the first job); the fastest attention
        backend measured among them becomes the hardware's, which the plan picks."""
        calibration = self.timing.calibration(Path(request.outputs_dir), self.hardware,
                                              lambda work: self._timed(job, "calibrate", work))
        self._use_calibration(calibration)
        return calibration

    def _timed(self, job: _Job, phase: str, work: Callable):
        with self._phase(job, phase):
            return work()

    def _announce(self, plan: Plan, job: _Job, predicted=None) -> None:
        data = plan.to_dict()
        if predicted is not None:
            data.update(predicted_seconds=dict(predicted.seconds), predicted_total=predicted.total)
        job.emit(PlanReady(job.id, data))
        for sentence in plan.decisions:
            job.emit(Info(job.id, f"Plan: {sentence}"))

    def _load_and_denoise(self, resolved: ResolvedModel, plan: Plan, request: GenerationRequest, job: _Job):
        import torch

        job.device = plan.device
        loaded = self._ensure_loaded(resolved, plan, job)
        set_vae_tiling(loaded.pipe.vae, plan.vae_tile)
        self._apply_speed(loaded, request, job)
        self._apply_loras(loaded, request, job)
        self._check_cancel(job)
        with torch.inference_mode():
            embeds = self._encode_text(loaded, request, job)
            image = self._encode_image(loaded, request, job)
            self._check_cancel(job)
            with self._split_denoise(loaded, request, job):
                latents = self._denoise(loaded, request, job, embeds, image)
        return loaded, latents

    @contextmanager
    def _split_denoise(self, loaded: LoadedModel, request: GenerationRequest, job: _Job):
        """A split job's denoise: every rank at the gate, then the transformers context parallel (Ulysses or
        Ring, as the plan says) while it runs; their hooks are removed afterwards. Nothing for a whole job."""
        if job.split is None:
            yield
            return
        job.split.gate(job.should_cancel)
        with job.split.parallel(transformers_of(loaded.for_mode(request.settings.mode)), loaded.plan.split):
            yield

    @staticmethod
    def _check_model_fits_request(model: ResolvedModel, spec: ModelSpec, request: GenerationRequest) -> None:
        if request.settings.mode == "i2v" and not model.takes_image:
            raise InputError(f"{model.ref} is a text-to-video model; pick an image-to-video model for this tab")
        if request.settings.mode != "i2v" and model.image_to_video:
            raise InputError(f"{model.ref} is an image-to-video model; use the Image to Video tab with an image")
        if request.settings.mode == "i2v":
            first_last = model.last_frame
            if first_last is False and request.last_image:
                raise InputError(f"{model.ref} cannot use a last frame (only first-and-last-frame models such as "
                                 "Wan2.1-FLF2V-14B can); remove the last frame")
            if first_last and not request.last_image:
                raise InputError(f"{model.ref} is a first-and-last-frame model and needs a last frame too; "
                                 "add one")
        check_model_limits(spec, request.settings.width, request.settings.height, request.settings.frames, request.settings.mode)
        check_experts(request.settings, limits_of(spec))

    def _encode_text(self, loaded: LoadedModel, request: GenerationRequest, job: _Job):
        pipe, plan = loaded.pipe, loaded.plan
        key = (loaded.model.ref, loaded.model.revision, request.prompt, request.negative_prompt or "",
               request.settings.guidance > 1.0, plan.dtype)
        with self._phase(job, "text_encode"):
            if key in self._prompt_cache:
                job.emit(Info(job.id, "Same prompt as a recent run: its encoding is reused, the text encoder is not run."))
                self._prompt_cache.move_to_end(key)
                positive, negative = self._prompt_cache[key]
            else:
                self._warn_if_truncated(pipe, request, job)
                with encoder_visiting(pipe, "text_encoder", plan):
                    positive, negative = pipe.encode_prompt(
                        prompt=request.prompt, negative_prompt=request.negative_prompt or "",
                        do_classifier_free_guidance=request.settings.guidance > 1.0, max_sequence_length=TEXT_TOKENS,
                        device=encoder_device(plan), dtype=torch_dtype(plan.dtype))
                positive = positive.to("cpu")
                negative = negative.to("cpu") if negative is not None else None
                self._prompt_cache[key] = (positive, negative)
                while len(self._prompt_cache) > PROMPT_CACHE_SIZE:
                    self._prompt_cache.popitem(last=False)
            positive = positive.to(plan.device)
            negative = negative.to(plan.device) if negative is not None else None
        return positive, negative

    @staticmethod
    def _warn_if_truncated(pipe, request: GenerationRequest, job: _Job) -> None:
        """Say so when the text encoder will see only the first TEXT_TOKENS tokens of a prompt."""
        for name, text in (("prompt", request.prompt), ("negative prompt", request.negative_prompt)):
            if not text:
                continue
            count = len(pipe.tokenizer(text, add_special_tokens=True, truncation=False).input_ids)
            if count > TEXT_TOKENS:
                job.emit(Info(job.id, f"The {name} is {count} tokens long; only the first {TEXT_TOKENS} are used, "
                                      "so its end has no effect. Shorten it to keep every part."))

    def _encode_image(self, loaded: LoadedModel, request: GenerationRequest, job: _Job) -> ImageInputs:
        if request.settings.mode != "i2v":
            return ImageInputs()
        from engine.settings.images import fit_image

        pipe, plan = loaded.for_mode(request.settings.mode), loaded.plan
        image = fit_image(request.image, request.settings.width, request.settings.height)
        last = (fit_image(request.last_image, request.settings.width, request.settings.height, name="last image")
                if request.last_image else None)
        if getattr(pipe, "image_encoder", None) is None:   # Wan2.2 TI2V-5B: the image goes into the latents only
            return ImageInputs(image, last)
        with self._phase(job, "image_encode"):
            with encoder_visiting(pipe, "image_encoder", plan):
                embeds = clip_image_embeds(pipe, [image] if last is None else [image, last], plan.device)
        return ImageInputs(image, last, embeds)

    def _denoise(self, loaded: LoadedModel, request: GenerationRequest, job: _Job, embeds, image: ImageInputs):
        import torch

        from engine.run.speedups import steps_per_transformer

        pipe = loaded.for_mode(request.settings.mode)
        pipe.scheduler = make_scheduler(loaded.scheduler_config, request.settings.shift, request.settings.sigmas,
                                        request.settings.scheduler, request.seed)
        total = request.settings.steps
        counts = steps_per_transformer(pipe, total)
        switch = switch_step(counts, total)
        if TRANSFORMERS[1] in counts:
            job.experts = {"steps": counts, "switch_step": switch, "swapped": loaded.experts is not None,
                           "boundary_ratio": pipe.config.boundary_ratio}
        last = [0.0]
        preview_seconds = self.preview_seconds if job.split is None or job.split.group.lead else -1
        previews = LivePreview(job.id, total, preview_seconds, request.settings.fps / pipe.vae_scale_factor_temporal,
                               lambda: self._preview_map(loaded))

        def on_step_end(pipeline, i, t, tensors):
            synchronize(job.device)
            now = clock()
            seconds = now - last[0]
            previews.settle()   # the previous step's preview is emitted before this step's news
            job.step_seconds.append(round(seconds, 4))
            mean = sum(job.step_seconds) / len(job.step_seconds)
            job.emit(StepFinished(job.id, i + 1, total, seconds, mean * (total - i - 1), peak_vram_gb(),
                                  job.ram.peak_gb if job.ram else None))
            if job.split.agree(job.should_cancel()) if job.split else job.should_cancel():
                pipeline._interrupt = True
            else:
                previews.emit_after_step(pipeline.scheduler, i, tensors["latents"], job.emit)
                if i + 1 == switch:   # the next step is the low-noise expert's: it comes to the device now
                    self._bring_expert(loaded, TRANSFORMERS[1], job)
            # A preview's cost is in its event and in the denoise phase, not in the step times;
            # its encoding overlaps the next step.
            last[0] = clock()
            return {}

        positive, negative = embeds
        guidance_2 = request.settings.guidance_2
        with self._phase(job, "denoise") as phase:
            self._bring_expert(loaded, TRANSFORMERS[0] if switch != 0 else TRANSFORMERS[1], job)
            # The first step is timed from the transformer's first pass: what the pipeline does before it
            # (image-to-video encodes its conditioning frames with the VAE, 0.45 s for a 14B 480p video) is the
            # denoise phase's, said in its detail, not the first step's (which would skew the mean and the ETA).
            prepared = FirstPass(job.device, clock, last)
            phase.detail = prepared.detail
            try:
                with reusing_image_embeds(pipe, image.embeds), self._step_cache(loaded, pipe, request, job), \
                        prepared.watching(transformers_of(pipe)):
                    output = pipe(
                        prompt_embeds=positive,
                        negative_prompt_embeds=negative if request.settings.guidance > 1.0 else None,
                        height=request.settings.height, width=request.settings.width, num_frames=request.settings.frames,
                        num_inference_steps=total, guidance_scale=request.settings.guidance,
                        **({"guidance_scale_2": guidance_2} if guidance_2 is not None else {}),
                        generator=torch.Generator("cpu").manual_seed(request.seed),
                        max_sequence_length=TEXT_TOKENS, output_type="latent",
                        callback_on_step_end=on_step_end, **image.pipe_inputs())
            finally:
                previews.close()   # the last preview belongs to the denoising, before anything after it
        if len(job.step_seconds) < total or (job.split.agree(False) if job.split else job.should_cancel()):
            raise Cancelled()
        return output.frames

    def _bring_expert(self, loaded: LoadedModel, name: str, job: _Job) -> None:
        """With one expert on the device at a time: expert ``name`` there, the other back in RAM, in the timed
        expert_swap phase (nothing happens when it is there already, or when the plan keeps both on the device)."""
        experts = loaded.experts
        if experts is None or experts.on_device == name:
            return
        with self._phase(job, "expert_swap") as phase:
            experts.bring(name)
            low = name == TRANSFORMERS[1]
            phase.detail = ("the low-noise expert on the device, the high-noise one back in RAM" if low
                            else "the high-noise expert back on the device for a new run")

    # ----- the step's speed: attention, compiling, step caches --------------------
    def _apply_speed(self, loaded: LoadedModel, request: GenerationRequest, job: _Job) -> None:
        """The plan's attention backend and compiling, on the loaded pipeline (cheap when unchanged)."""
        from engine.run.speedups import compile_transformer, set_attention, uncompile_transformer

        plan, pipe = loaded.plan, loaded.for_mode(request.settings.mode)
        set_attention(pipe, None if plan.attention_backend == "native" else plan.attention_backend)
        if plan.compile:
            if compile_transformer(pipe):
                job.emit(Info(job.id, "Compiling the transformer's blocks: the first step at each new size takes "
                                      "longer (seconds to a minute), every later one is faster."))
        else:
            uncompile_transformer(pipe)

    def _apply_loras(self, loaded: LoadedModel, request: GenerationRequest, job: _Job) -> None:
        """The request's LoRAs on the loaded transformer(s), each file read once and kept (engine/run/lora.py), in
        their own phase; without any, the adapters the model holds are turned off (at once: no phase)."""
        from engine.run.lora import apply_loras, loaded_adapters
        from engine.run.lora_diffs import added_key
        from engine.run.lora_fusion import merged_key

        pipe = loaded.for_mode(request.settings.mode)
        parked = loaded.experts.parked if loaded.experts is not None else nullcontext
        if request.settings.loras:
            with self._phase(job, "lora") as phase:
                setup = apply_loras(pipe, request.settings.loras, loaded.model.ref, torch_dtype(loaded.plan.dtype),
                                    streamed=loaded.plan.transformer != "device" or loaded.plan.swaps_experts,
                                    disk=loaded.plan.transformer == "disk", parked=parked)
                phase.detail = setup.detail
            job.loras_beside = bool(setup.beside)
        elif any(merged_key(model) or added_key(model) for model in transformers_of(pipe)):   # originals back: timed
            with self._phase(job, "lora") as phase:
                setup = apply_loras(pipe, (), parked=parked)
                phase.detail = "merge taken out"
        elif loaded_adapters(pipe):
            setup = apply_loras(pipe, (), parked=parked)
        else:
            return
        for line in setup.sentences():
            job.emit(Info(job.id, line))

    @contextmanager
    def _step_cache(self, loaded: LoadedModel, pipe, request: GenerationRequest, job: _Job):
        """The request's step cache (approximate) on the transformer while it denoises, removed afterwards;
        MagCache's first run with a model and step count calibrates it (computes every step) and keeps its
        ratios for the next runs."""
        kind = request.settings.step_cache
        if not kind:
            yield
            return
        from engine.run.speedups import (apply_step_cache, calibration_ratios, load_mag_ratios, remove_step_cache,
                                         save_mag_ratios, uncompile_transformer)

        folder, key = self.models_dir / CALIBRATION_FOLDER, self._cache_key(loaded, request)
        uncompile_transformer(pipe)   # a cache's hooks need the plain blocks
        setup = apply_step_cache(pipe, kind, request.settings.steps,
                                 load_mag_ratios(folder, key, request.settings.steps) if kind == "mag" else None)
        job.cache = setup.detail
        job.emit(Info(job.id, f"Step cache (approximate): {setup.detail}"))
        try:
            yield
            if setup.calibrating and len(job.step_seconds) == request.settings.steps:
                save_mag_ratios(folder, key, request.settings.steps, calibration_ratios(pipe))
        finally:
            remove_step_cache(pipe)

    @staticmethod
    def _cache_key(loaded: LoadedModel, request: GenerationRequest) -> str:
        """What MagCache's ratios depend on: the model, its version, the scheduler and its shift, its LoRAs."""
        settings = request.settings
        loras = tuple((lora.shown, lora.strength) for lora in settings.loras if lora.strength)
        return "-".join(str(part) for part in (loaded.model.ref, loaded.model.revision, settings.scheduler,
                                                settings.shift, settings.mode, *((loras,) if loras else ())))

    def _preview_map(self, loaded: LoadedModel) -> PreviewMap | DecoderPreview:
        """How the loaded model's previews are made, chosen once: through its fast decoder on a GPU when one is
        on disk (real pixels), else the latent -> RGB map (a model without known factors decodes a little)."""
        if loaded.preview_map is None:
            loaded.preview_map = self._decoder_preview(loaded) or preview_map_for(loaded.pipe.vae)
        return loaded.preview_map

    def _decoder_preview(self, loaded: LoadedModel) -> DecoderPreview | None:
        from engine.run.fast_decoder import find_fast_decoder, load_fast_decoder

        vae = loaded.pipe.vae
        path = find_fast_decoder(self.models_dir, vae.config.z_dim, loaded.model.folder)
        if path is None or loaded.plan.device == "cpu":
            return None
        if path not in loaded.fast_decoders:
            loaded.fast_decoders[path] = load_fast_decoder(path, loaded.plan.device)
        return DecoderPreview(loaded.fast_decoders[path], vae.config.latents_mean, vae.config.latents_std)

    @staticmethod
    def _speed_record(plan: Plan, request: GenerationRequest, job: _Job) -> dict:
        """How the run was made fast, and whether any of it is approximate (the sidecar's "speed")."""
        cache = request.settings.step_cache
        return {"decoder": job.decoder, "step_cache": cache, "step_cache_detail": job.cache,
                "approximate": job.decoder != "vae" or bool(cache),
                "vae_dtype": plan.vae_dtype, "conv": plan.conv,
                "compiled": plan.compile and not job.loras_beside,
                "loras": ("beside the weights" if job.loras_beside else "merged")
                if any(lora.strength for lora in request.settings.loras) else None,
                "attention": plan.attention_backend,
                "predicted_seconds": dict(job.predicted.seconds) if job.predicted is not None else None}

    # ----- export -------------------------------------------------------------
    def _write_sidecar(self, loaded: LoadedModel, request: GenerationRequest, job: _Job, bundle: Bundle,
                       media: Path, shape: tuple) -> Path:
        sidecar = run_record(request, media, shape, model=loaded.model, plan=loaded.plan.to_dict(),
                             step_downs=job.step_downs, latents=job.latents, decode_fallback=job.decode_fallback,
                             timings=job.timings, step_seconds=job.step_seconds, peak_ram_gb=job.ram.peak_gb,
                             hardware=self.hardware.to_dict(), inputs=job.inputs,
                             note=SELFTEST_NOTE if loaded.model.selftest else "",
                             speed=self._speed_record(loaded.plan, request, job), experts=job.experts)
        return write_sidecar(sidecar, bundle.sidecar)
