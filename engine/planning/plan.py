"""What the memory planner (engine/planning/planner.py) is asked and what it answers: the request, what the
user forces, and the plan with each of its phases."""
from __future__ import annotations

from dataclasses import asdict, dataclass

from engine.models.windows import OVERLAP_FRAMES
from engine.planning.places import TransformerPlace
from engine.planning.speed import ATTENTION_BACKENDS, VAE_DTYPES, SpeedRequest
from engine.planning.split import Split
from engine.settings.choices import LADDER, TEXT_ENCODER_PLACES


@dataclass(frozen=True)
class PlanRequest:
    width: int
    height: int
    frames: int
    image_to_video: bool = False
    speed: SpeedRequest = SpeedRequest()    # steps, guidance, step cache: what the speed choices read
    # GPUs sharing the denoise (context parallel): each holds the whole model and 1/ranks of the activations.
    ranks: int = 1
    # A longer video is denoised in windows of this many frames (0: the model's own), neighbours sharing at least
    # ``overlap``: a pass sees one window.
    window: int = 0
    overlap: int = OVERLAP_FRAMES
    # The steps after the video is written (engine/post/): smoother and larger, by these factors (1: off).
    interpolate: int = 1
    upscale: int = 1
    # Video to video: its input video is encoded by the VAE first (video_encode); an extension: its new part is joined
    # after the video it continues (join).
    video_input: bool = False
    extends: bool = False
    # The decoder (settings.DECODERS): "vae_fast" decodes with channels-last convolutions and several latent frames
    # a call, as many as the device has room for.
    decoder: str = "vae"
    # "fp8": the transformer's block linears compute in float8 (approximate; engine/run/speedups.py fp8_linears).
    compute: str = "exact"
    loras: bool = False   # the request carries LoRAs (they go into 16-bit weights)


@dataclass(frozen=True)
class Override:
    """What the user forces; None leaves the choice to the planner."""
    strategy: str | None = None
    text_encoder: str | None = None       # one of TEXT_ENCODER_PLACES
    vae_tiling: bool | None = None
    vae_dtype: str | None = None          # one of speed.VAE_DTYPES
    compile: bool | None = None
    attention: str | None = None          # one of speed.ATTENTION_BACKENDS
    guidance_batch: bool | None = None

    def __post_init__(self):
        if self.strategy is not None and self.strategy not in LADDER:
            raise ValueError(f"unknown strategy {self.strategy!r}; choose one of {', '.join(LADDER)}")
        if self.text_encoder is not None and self.text_encoder not in TEXT_ENCODER_PLACES:
            raise ValueError(f"text encoder place must be one of {', '.join(TEXT_ENCODER_PLACES)}")
        if self.vae_dtype is not None and self.vae_dtype not in VAE_DTYPES:
            raise ValueError(f"VAE precision must be one of {', '.join(VAE_DTYPES)}")
        if self.attention is not None and self.attention not in ATTENTION_BACKENDS:
            raise ValueError(f"attention backend must be one of {', '.join(ATTENTION_BACKENDS)}")


@dataclass(frozen=True)
class PhasePlan:
    phase: str
    placement: dict            # Component -> ComponentPlace (engine/planning/places.py)
    peak_vram_gb: float
    peak_ram_gb: float
    # The load's weight files read through memory maps beside peak_ram_gb: page cache, which the process's resident
    # memory shows and the system can drop (engine/planning/memory.py mapped_gb); 0 for the other phases.
    mapped_gb: float = 0.0


@dataclass(frozen=True)
class Plan:
    strategy: str
    fits: bool
    device: str
    dtype: str
    vae_dtype: str
    attention: str             # "flash" (no tokens^2 buffer) or "math"
    text_encoder: str          # one of TEXT_ENCODER_PLACES
    transformer: TransformerPlace
    fp8: bool
    vae_tile: int | None       # tile size in pixels, None = untiled
    load: str                  # "cpu" (through RAM) or "device_map" (straight to the device)
    pin_memory: bool
    use_stream: bool
    budget_vram_gb: float
    budget_ram_gb: float
    predicted_peak_vram_gb: float
    predicted_peak_ram_gb: float
    phases: tuple[PhasePlan, ...] = ()
    decisions: tuple[str, ...] = ()
    suggestions: tuple[str, ...] = ()
    vae_tiled: bool = False    # the decode really runs in tiles (a frame no larger than one tile decodes whole)
    conv: str = "default"      # the decode's convolution set-up: one of speed.CONV_MODES
    compile: bool = False      # the transformer's repeated blocks are compiled
    attention_backend: str = "native"   # diffusers' attention backend for the transformer
    # Each expert's single transformer file as (path, bytes, modification time in ns), None for the model's own;
    # empty when every transformer is the model's own. Another file (or the same one rewritten) is another load.
    transformer_files: tuple = ()
    split: Split | None = None   # how the job uses several GPUs (None: one)
    decode_window: int = 1     # latent frames a call of the VAE's decoder takes after the first (1: one at a time)
    channels_last: bool = False   # the VAE's 3-D convolutions decode in channels-last layout (approximate)
    guidance_batch: bool = False  # a step's two guided passes run as one batch (engine/run/guidance_batch.py)
    fp8_compute: bool = False     # the transformer's block linears compute in float8 (approximate)

    @property
    def swaps_experts(self) -> bool:
        """One expert on the device at a time, swapped at the boundary (the engine's expert_swap phase)."""
        return self.strategy == "expert_swap"

    @property
    def refusal(self) -> str:
        """Why a job with this plan is not started when it does not fit, with what would make it fit."""
        memory = (f"about {self.predicted_peak_ram_gb:.1f} GB of RAM where {self.budget_ram_gb:.1f} GB may be used"
                  if self.device == "cpu" else
                  f"about {self.predicted_peak_vram_gb:.1f} GB of device memory where {self.budget_vram_gb:.1f} GB "
                  f"may be used")
        fixes = self.suggestions or ("Pick a smaller model or preset: the page's Presets tab, or `python app.py plan "
                                     "--preset NAME`, says which fit this machine.",)
        return " ".join((f"this request does not fit this machine's memory: it needs {memory}.", *fixes))

    def to_dict(self) -> dict:
        data = asdict(self)
        data["phases"] = {p["phase"]: {k: v for k, v in p.items() if k != "phase"} for p in data["phases"]}
        return data

    @property
    def reload_key(self) -> tuple:
        """What cannot change on a loaded pipeline without loading it again (another VAE precision loads the VAE
        alone again: engine/run/apply_plan.py use_vae_dtype)."""
        return (self.strategy, self.device, self.dtype, self.transformer, self.fp8, self.load, self.transformer_files,
                self.fp8_compute)
