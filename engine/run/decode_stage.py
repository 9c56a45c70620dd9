"""The decode and write half of a run: latents to frames to a media file, with the decode's own fallbacks.

A video planned untiled is streamed: the VAE's frames go to the encoder as they decode, so the file is
finished a moment after the last frame. A still, a tiled decode or a stream that ran out of memory decodes
the whole clip, retrying tiled and then on the CPU from the same latents (the denoise is never repeated). The
fast decoder (approximate) streams the same way; saved latents can be decoded again without loading the rest
of the model.

``Decoder`` does this for one job, given the job (its phases and record) and the models folder; the loaded model,
the plan and the saved latents come with each call.
"""
from __future__ import annotations

from contextlib import closing, contextmanager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from engine.device.runtime import free_device_memory, peak_vram_gb
from engine.events import JobFinished, Phase
from engine.models.refs import ResolvedModel
from engine.outputs.bundle import Bundle
from engine.outputs.export import output_stem
from engine.outputs.kept_inputs import carry_inputs
from engine.outputs.latents import load_latents
from engine.outputs.record import open_video_stream, redecode_record, write_media
from engine.outputs.sidecar import write_sidecar
from engine.planning.memory import VAE_TILES
from engine.planning.planner import Plan
from engine.run.apply_plan import conv_settings, decoder_layout, set_vae_tiling
from engine.run.decoding import decode_attempts, decode_latents, decode_stream, decoded_shape
from engine.run.failures import is_out_of_memory
from engine.run.job import Job
from engine.run.loaded import LoadedModel
from engine.run.nonfinite import refuse_nonfinite
from engine.settings.request import GenerationRequest
from engine.settings.values import InputError

# The fast decoder's frames go to the encoder this many latent frames at a time (4 video frames): on an H200
# at 832x480x81 in float16, 0.7 GiB and 0.126 s, against 8.2 GiB and 0.115 s for the whole clip at once.
FAST_DECODE_CHUNK = 1


# What to do when the denoise ends in NaN: with files of the user's own in the run (one, or several), or with the
# model's alone.
WITH_FILE_HINT = ("It passed the check of its values, yet it may be damaged or not suited to this model: run again "
                  "without it, or with a lower LoRA strength; download it again if it keeps happening.")
WITH_FILES_HINT = ("Each passed the check of its values, yet one may be damaged or not suited to this model: run "
                   "again without them, or with lower LoRA strengths, to find which; download that one again.")
OWN_WEIGHTS_HINT = ("Try a lower guidance or another memory strategy; if it keeps happening, the model's files may be "
                    "damaged: download the model again.")


def files_in_use(loaded: LoadedModel, request: GenerationRequest) -> list[str]:
    """The files of the run besides the model's folder, as messages name them: its transformer files and LoRAs."""
    files = [f"the transformer file {file.name}" for file in loaded.model.transformer_files if file is not None]
    loras = [f"{lora.shown} at {lora.strength:g}" for lora in request.settings.loras if lora.strength]
    if loras:
        files.append(("the LoRA " if len(loras) == 1 else "the LoRAs ") + ", ".join(loras))
    return files


def check_latents(loaded: LoadedModel, request: GenerationRequest, latents) -> None:
    """NonFiniteValues, naming the files in use, when the denoise ended in NaN or infinite values: nothing is
    saved or decoded (a decode would write black frames)."""
    files = files_in_use(loaded, request)
    with_what = f" with {' and '.join(files)}" if files else f" with {loaded.model.ref}'s own weights"
    several = len(files) > 1 or sum(bool(lora.strength) for lora in request.settings.loras) > 1
    hint = (WITH_FILES_HINT if several else WITH_FILE_HINT) if files else OWN_WEIGHTS_HINT
    refuse_nonfinite(latents, "The denoising", "the latents", f"{with_what}, so there is no video to decode; "
                     "nothing was saved", hint)


@dataclass(frozen=True)
class SavedLatents:
    """A run's saved latents, read back: the file, the tensor, its metadata and the request it records."""
    path: Path
    latents: object
    meta: dict
    request: GenerationRequest

    @classmethod
    def read(cls, path: Path) -> "SavedLatents":
        latents, meta = load_latents(path)
        return cls(path, latents, meta, GenerationRequest.from_dict(dict(meta["request"])))


@dataclass(frozen=True)
class VaeParts:
    """The VAE a decode again uses, its video processor, and whether it is the loaded model's (shared)."""
    vae: object
    video_processor: object
    shared: bool


@contextmanager
def stopping_between_frames(vae, check: Callable[[], None]):
    """``check()`` (a cancel's: it raises) before each call of ``vae``'s decoder, which a Wan VAE makes once per
    latent frame (per tile, tiled): a cancel stops a long decode within a frame, whichever way it decodes."""
    decoder = getattr(vae, "decoder", None)
    hook = getattr(decoder, "register_forward_pre_hook", None)
    handle = hook(lambda module, args: check()) if callable(hook) else None
    try:
        yield
    finally:
        if handle is not None:
            handle.remove()


class Decoder:
    """Latents to a media file for ``job``: streamed, whole with its fallbacks, or through the fast decoder."""

    def __init__(self, job: Job, models_dir: Path):
        self.job = job
        self.models_dir = models_dir
        self.fast_file: Path | None = None   # the fast decoder's file, when the job decodes with it
        self.light_file: Path | None = None  # the light VAE's file, when the job decodes with it

    # ----- decode, with its own fallbacks --------------------------------------
    def decode_and_write(self, loaded: LoadedModel, request: GenerationRequest, latents, bundle: Bundle):
        """(the media file, the frames' shape). A video planned untiled is streamed; a still, a tiled decode
        or a stream out of memory decodes the whole clip (its fallbacks next: tiled, then on the CPU), then
        writes it."""
        pipe, plan = loaded.pipe, loaded.plan
        if self.fast_file is not None:
            return self._fast_decode_and_write(loaded, request, latents, bundle)
        vae = pipe.vae if self.light_file is None else self._light_vae(loaded)
        with stopping_between_frames(vae, self.job.check_cancel):
            return self._decode_vae_and_write(vae, pipe.video_processor, plan, request, latents, bundle)

    def _decode_vae_and_write(self, vae, video_processor, plan: Plan, request: GenerationRequest, latents,
                              bundle: Bundle):
        first = 0
        if request.settings.mode != "t2i" and plan.vae_tile is None:
            try:
                return self._decode_streaming(vae, plan, request, latents, bundle)
            except Exception as exc:
                if not is_out_of_memory(exc) or self.job.phase != "vae_decode":
                    raise
                first = 1   # the stream was the planned attempt; it left nothing on disk
                self._retrying(decode_attempts(plan.vae_tile, plan.device, VAE_TILES)[first][0])
        frames = self._decode(vae, video_processor, plan, latents, first)
        with self.job.in_phase(Phase.EXPORT):
            media = write_media(request, frames, bundle)
        return media, frames.shape

    def _decode_streaming(self, vae, plan: Plan, request: GenerationRequest, latents, bundle: Bundle):
        """The VAE's frames go to the encoder as they decode, with the plan's convolution set-up."""
        with conv_settings(plan.conv), decoder_layout(vae, plan.channels_last):
            return self._write_streaming(request, decoded_shape(vae, latents),
                                         decode_stream(vae, latents, plan.device, plan.decode_window), bundle)

    def _write_streaming(self, request: GenerationRequest, shape: tuple, batches, bundle: Bundle):
        """(the media file, its shape): the decoder's ``batches`` of frames go to the encoder as they come;
        vae_decode times the decode (the encoding overlaps it), export only the encoder's tail after the last
        frame. The file is complete or absent, whatever fails."""
        # The disk-room check is the export's, asked before the decode spends its time.
        with self.job.in_phase(Phase.EXPORT, timed=False), open_video_stream(request, shape, bundle) as video, \
                closing(batches) as decoded:   # closed: caches freed
            with self.job.in_phase(Phase.VAE_DECODE):
                for frames in decoded:
                    self.job.check_cancel()
                    video.send(frames)
            with self.job.in_phase(Phase.EXPORT):
                return video.close(), video.shape

    def _retrying(self, how: str) -> None:
        free_device_memory()
        self.job.info(f"Out of memory in the VAE decode; retrying {how} from the same latents.")

    def _decode(self, vae, video_processor, plan: Plan, latents, first: int = 0):
        """Decode as planned; on out-of-memory retry tiled, then on the CPU. The denoise is never repeated.
        ``first``: the attempt to start from (1 when a streamed decode ran out of memory as planned)."""
        attempts = decode_attempts(plan.vae_tile, plan.device, VAE_TILES)
        for number, (how, tile, device) in enumerate(attempts[first:], first):
            try:
                frames = self._decode_once(vae, video_processor, latents, tile, device,
                                           plan.conv if device == plan.device else "default", plan.channels_last)
                if number:
                    self.job.decode_fell_back(how)
                return frames
            except Exception as exc:
                if not is_out_of_memory(exc) or number == len(attempts) - 1:
                    raise
                self._retrying(attempts[number + 1][0])
            finally:
                if device != plan.device:
                    vae.to(plan.device)
                set_vae_tiling(vae, plan.vae_tile)

    def _decode_once(self, vae, video_processor, latents, tile: int | None, device: str, conv: str = "default",
                     channels_last: bool = False):
        with self.job.in_phase(Phase.VAE_DECODE), conv_settings(conv), decoder_layout(vae, channels_last):
            return decode_latents(vae, video_processor, latents, tile, device)

    # ----- the fast decoder (approximate) ---------------------------------------
    def use_fast_decoder(self, resolved: ResolvedModel, loaded: LoadedModel | None) -> None:
        """Decode with the fast decoder for this model's latents: on disk, else downloaded once (its own phase),
        and read (its layout, its latents' channels and its values checked) unless ``loaded`` (the model loaded
        now) has it already, all before the denoise; InputError saying where to put one when there is none, or
        what is wrong with it."""
        from engine.models.fast_decoder_file import (FastDecoderError, check_matches, find_fast_decoder,
                                                     locate_fast_decoder, read_fast_decoder)

        z_dim = 48 if resolved.spec.wan22_vae else 16
        try:
            found = self._on_disk_or_fetched(find_fast_decoder, locate_fast_decoder, resolved, z_dim)
            if loaded is None or found not in loaded.fast_decoders:
                check_matches(read_fast_decoder(found)[0], z_dim)
        except FastDecoderError as exc:
            raise InputError(str(exc)) from None
        self.fast_file = found

    def _on_disk_or_fetched(self, find, locate, resolved: ResolvedModel, z_dim: int) -> Path:
        """A decoder's file for these latents: ``find`` on disk, else ``locate`` (the download, its own phase)."""
        from engine.models.refs import hub_offline

        found = find(self.models_dir, z_dim, resolved.folder)
        if found is None:
            with self.job.in_phase(Phase.DOWNLOAD):
                found = locate(self.models_dir, z_dim, resolved.folder, offline=hub_offline())
        return found

    def _fast_decode_and_write(self, loaded: LoadedModel, request: GenerationRequest, latents, bundle: Bundle):
        """(the media file, the frames' shape) from the fast decoder: approximate, a fraction of the VAE's time
        and memory; the frames are written as they decode, as the VAE's are."""
        path, config = self.fast_file, loaded.pipe.vae.config
        loading = path not in loaded.fast_decoders   # its load (untimed) is the decode's
        with self.job.in_phase(Phase.VAE_DECODE, timed=False) if loading else nullcontext():
            decoder = loaded.fast_decoder(path, check_z_dim=config.z_dim)
        self.job.decoding_fast(decoder.info.name)
        if request.settings.mode == "t2i":
            with self.job.in_phase(Phase.VAE_DECODE):
                frames = decoder.decode(latents, config.latents_mean, config.latents_std).cpu().numpy()
            with self.job.in_phase(Phase.EXPORT):
                return write_media(request, frames, bundle), frames.shape
        shape = (decoder.info.frames_out(latents.shape[2]), latents.shape[3] * decoder.info.scale,
                 latents.shape[4] * decoder.info.scale, 3)
        batches = (frames.cpu().numpy() for frames in decoder.stream(latents, FAST_DECODE_CHUNK,
                                                                    config.latents_mean, config.latents_std))
        return self._write_streaming(request, shape, batches, bundle)

    # ----- the light VAE (approximate) ----------------------------------------
    def use_light_vae(self, resolved: ResolvedModel, loaded: LoadedModel | None) -> None:
        """Decode with the light VAE for this model's latents: on disk, else downloaded once (its own phase), and
        read against the model's VAE config (its layout, width and values checked) unless ``loaded`` (the model
        loaded now) has it already, all before the denoise; InputError saying where to put one when there is
        none, or what is wrong with it."""
        import json

        from engine.models.light_vae_file import LightVaeError, find_light_vae, locate_light_vae, read_light_vae

        z_dim = 48 if resolved.spec.wan22_vae else 16
        try:
            found = self._on_disk_or_fetched(find_light_vae, locate_light_vae, resolved, z_dim)
            if loaded is None or found not in loaded.light_vaes:
                config = json.loads((Path(resolved.folder) / "vae" / "config.json").read_text(encoding="utf-8"))
                read_light_vae(found, config)
        except LightVaeError as exc:
            raise InputError(str(exc)) from None
        self.light_file = found

    def _light_vae(self, loaded: LoadedModel):
        """The light VAE, loaded (untimed, the decode's) and said; InputError when it does not fit the model."""
        from engine.models.light_vae_file import LightVaeError

        try:
            with self.job.in_phase(Phase.VAE_DECODE, timed=False):
                vae = loaded.light_vae(self.light_file)
        except LightVaeError as exc:
            raise InputError(str(exc)) from None
        self.job.decoding_light(self.light_file.stem)
        return vae

    # ----- decode again, from saved latents ------------------------------------
    def vae_for(self, resolved: ResolvedModel, loaded: LoadedModel | None) -> VaeParts:
        """``loaded``'s VAE (the model loaded now, when it is this one), or the VAE alone from the model's files
        (nothing else is loaded)."""
        if loaded is not None:
            return VaeParts(loaded.pipe.vae, loaded.pipe.video_processor, shared=True)
        import torch
        from diffusers import AutoencoderKLWan
        from diffusers.video_processor import VideoProcessor

        with self.job.in_phase(Phase.LOAD):
            vae = AutoencoderKLWan.from_pretrained(resolved.folder, subfolder="vae", dtype=torch.float32)
        return VaeParts(vae, VideoProcessor(vae_scale_factor=vae.config.scale_factor_spatial), shared=False)

    def decode_saved(self, saved: SavedLatents, parts: VaeParts, plan: Plan, tiled: bool, on_cpu: bool,
                     hardware: dict) -> JobFinished:
        """A new video from ``saved`` (``tiled``, or ``on_cpu``, or as ``plan`` says), with its own sidecar."""
        request, job = saved.request, self.job
        device = "cpu" if on_cpu else plan.device
        tile = (plan.vae_tile or VAE_TILES[2]) if tiled else plan.vae_tile
        job.use_device(device)
        parts.vae.to(device)
        with stopping_between_frames(parts.vae, job.check_cancel):
            frames = self._decode_once(parts.vae, parts.video_processor, saved.latents, tile, device)
        if device != plan.device and parts.shared:
            parts.vae.to(plan.device)
        bundle = Bundle.from_latents(saved.path)   # the failed run's own name, unless a decode already filled it
        if bundle.has_output():
            bundle = Bundle(output_stem(saved.path.parent.parent, request.settings.mode, request.prompt, request.seed))
        with job.in_phase(Phase.EXPORT):
            media = write_media(request, frames, bundle)
        shape, joined, joining = self._join_again(request, media, Bundle.from_latents(saved.path).input("extend"))
        how = ", ".join(("tiled" if tile else "untiled", *(["on the CPU"] if on_cpu else [])))
        meta = saved.meta
        inputs = carry_inputs(meta["inputs"], saved.path.parent, bundle.stem) if meta.get("inputs") else None
        record = redecode_record(request, media, saved.path, how, meta.get("model"), dict(meta["request"]),
                                 job.timings, job.ram.peak_gb, hardware, inputs=inputs, extend=joined, shape=shape)
        sidecar = write_sidecar(record, bundle.sidecar)
        return JobFinished(job.id, (str(media),), str(sidecar), request.seed, dict(job.timings), peak_vram_gb(),
                           job.ram.peak_gb, f"Decoded again ({how}) from saved latents. {joining}".strip())

    def _join_again(self, request: GenerationRequest, media: Path, kept: Path
                    ) -> tuple[tuple | None, dict | None, str]:
        """An extension's part, decoded again at ``media``, joined after the video it extends as its run did (or
        after the copy its run ``kept`` of a video from outside the outputs folder): (the joined video's shape and
        the sidecar's "extend", or None and None; what the note says of it). A video no longer there leaves the
        part alone, said so; a join that fails takes the part with it (the latents stay, to decode again)."""
        if not request.extend:
            return None, None, ""
        from engine.post.extend import join_extension, joined_note

        video = next((path for path in (Path(request.extend), kept) if path.is_file()), None)
        if video is None:
            return None, None, (f"The video it extended ({Path(request.extend).name}) is no longer there: this is "
                                "the new part alone.")
        try:
            shape, joined = join_extension(self.job, replace(request, extend=str(video)), media)
        except BaseException:
            media.unlink(missing_ok=True)
            raise
        return shape, joined, joined_note(joined)
