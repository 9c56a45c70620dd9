"""The model the Engine holds between jobs, and what a job hands its pipeline besides the prompt.

``LoadedModel`` is the one loaded pipeline with its plan, and what is made for it at first use and kept as long
as it stays loaded: the image-to-video pipeline over its components (TI2V-5B), the live preview's map, the fast
decoders, the light VAE. ``ImageInputs`` and ``reusing_image_embeds`` carry an image-to-video run's frames and
their encoding into the pipeline's call.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from engine.models.refs import ResolvedModel
from engine.planning.planner import Plan
from engine.run.apply_plan import keep_encoder_exact
from engine.run.experts import ExpertSwap
from engine.run.preview import DecoderPreview, PreviewMap, preview_map_for


@dataclass
class LoadedModel:
    model: ResolvedModel
    pipe: object
    plan: Plan
    scheduler_config: dict
    preview_map: PreviewMap | None = None   # latent -> RGB for live previews, made at the first one
    image_pipe: object = None   # Wan2.2 TI2V-5B's image-to-video pipeline, over the same components
    fast_decoders: dict = field(default_factory=dict)   # file -> its FastDecoder, loaded at first use
    light_vaes: dict = field(default_factory=dict)   # file -> the light VAE (an AutoencoderKLWan), loaded at first use
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

    def fast_decoder(self, path: Path, check_z_dim: int | None = None):
        """The fast decoder in ``path``, loaded onto the plan's device at its first use and kept; ``check_z_dim``:
        the latent channels it must take, checked when it is loaded here (FastDecoderError otherwise)."""
        from engine.models.fast_decoder_file import check_matches
        from engine.run.fast_decoder import load_fast_decoder

        if path not in self.fast_decoders:
            decoder = load_fast_decoder(path, self.plan.device)
            if check_z_dim is not None:
                check_matches(decoder.info, check_z_dim)
            self.fast_decoders[path] = decoder
        return self.fast_decoders[path]

    def light_vae(self, path: Path):
        """The light VAE in ``path`` (engine/models/light_vae_file.py), read against this model's VAE, loaded onto
        the plan's device in the VAE's dtype at its first use and kept; LightVaeError when it does not fit."""
        from engine.models.light_vae_file import build_light_vae, light_vae_config, read_light_vae

        if path not in self.light_vaes:
            vae = self.pipe.vae
            info, state = read_light_vae(path, dict(vae.config))
            light = build_light_vae(light_vae_config(dict(vae.config), info.base_dim), state, vae.dtype)
            self.light_vaes[path] = light.to(self.plan.device)
        return self.light_vaes[path]

    def previews(self, models_dir: Path) -> PreviewMap | DecoderPreview:
        """How this model's previews are made, chosen once: through its fast decoder on a GPU when one is on disk
        (real pixels), else the latent -> RGB map (a model without known factors decodes a little)."""
        if self.preview_map is None:
            self.preview_map = self._decoder_preview(models_dir) or preview_map_for(self.pipe.vae)
        return self.preview_map

    def _decoder_preview(self, models_dir: Path) -> DecoderPreview | None:
        from engine.models.fast_decoder_file import find_fast_decoder

        vae = self.pipe.vae
        path = find_fast_decoder(models_dir, vae.config.z_dim, self.model.folder)
        if path is None or self.plan.device == "cpu":
            return None
        return DecoderPreview(self.fast_decoder(path), vae.config.latents_mean, vae.config.latents_std)


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
