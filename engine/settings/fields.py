"""Every value a job is made from, declared once: its name, how a preset file holds it, how a raw value (a box on
the page, a command-line option, an API argument) becomes it, its label, its choices and where it is shown.

The views of this table are what the rest of the app uses: the preset file's types (``SETTING_TYPES``), the
groups (``names_in``), the page's form and plan panel (``on_page``), the order of the page API's parameters
(``api_fields``) and the command line's options (``cli_fields``). Raw values become field values in one function,
``read``, which the page and the command line share; engine/settings/draft.py applies the preset and checks.

Adding a setting: its field in Settings (engine/settings/values.py), its check there, and one ``Field`` line
here; the preset files, the sidecars, the page's API, the command line and the plan panel carry it from then on.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from engine.models.loras import Lora
from engine.settings.choices import (ATTENTION_BACKENDS, COMPUTES, DECODERS, LADDER, STEP_CACHES, TEXT_ENCODER_PLACES,
                                     VAE_DTYPES)
from engine.settings.loras import parse_lora_lines

# Video to video's strength when none is given: most of the steps run, so the input's layout and motion stay while
# its look follows the prompt (diffusers' video-to-video pipeline starts at 0.8).
DEFAULT_VIDEO_STRENGTH = 0.7

# The page's words for "leave it to the planner", "none" and "no file: the model's own transformer".
AUTO = "Auto"
OFF = "Off"
OWN_TRANSFORMER = "(the model's own)"
ON_OFF = ("On", "Off")


class Group(str, Enum):
    """What a field is part of: a request (prompts, images, seed) or a setting of one kind."""
    REQUEST = "request"    # not a setting: the job's prompts, images, seed and the preset it starts from
    REQUIRED = "required"  # every preset file gives it
    RUN = "run"            # a setting the preset gives or leaves to its default (fps, scheduler, ...)
    MEMORY = "memory"      # a memory-plan override: optional in a preset file
    SPEED = "speed"        # a speed choice: optional in a preset file
    SOURCE = "source"      # the model's sources and adapters: optional, left out when at their defaults


class Parse(str, Enum):
    """How a raw value becomes the field's: anything unexpected stays as it came, for the check to refuse with
    its own sentence."""
    AS_GIVEN = "as_given"      # numbers and text as sent
    AUTO = "auto"              # a choice; Auto or empty leaves it to the planner (None)
    ON_OFF = "on_off"          # On / Off (any case) / Auto or empty: True / False / None
    OFF = "off"                # a choice; Off or empty is none (None)
    FIRST = "first"            # a choice; empty is the first choice
    OWN_FILE = "own_file"      # a file; the model's own (or empty) is None
    COUNT = "count"            # Auto or empty is 0 (automatic); "2" is 2
    LORAS = "loras"            # one "file: strength" a line (the page), or LoRAs already read (the command line)
    LOW_NOISE = "low_noise"    # the low-noise guidance: empty or 0 (as the box starts) is None, the same guidance


class Place(str, Enum):
    """Where the page shows a field."""
    IMAGES = "images"      # the Image to Video tab's uploads
    VIDEOS = "videos"      # a video the run starts from: the one an extension continues, a video-to-video input
    PROMPTS = "prompts"    # the preset, the prompt and the negative prompt
    FORM = "form"          # the settings boxes a preset fills
    PLAN = "plan"          # the memory plan panel's dropdowns, LoRA box and transformer files


@dataclass(frozen=True)
class Option:
    """A field's command-line option."""
    flag: str                       # "--width"
    kind: type = str                # what argparse makes of the text (the field's parse then applies)
    help: str | None = None
    metavar: str | None = None
    commands: tuple[str, ...] = ("generate", "plan")
    many: bool = False              # given again for more (--lora)
    dest: str | None = None         # where argparse keeps it, when not under the field's name

    def dest_of(self, field: "Field") -> str:
        return self.dest or field.name


@dataclass(frozen=True)
class Field:
    name: str                                   # a Settings field, or a request's part (Group.REQUEST)
    label: str                                  # on the page and in messages
    group: Group
    json: tuple[type, ...] = ()                 # how a preset file holds it (a setting only)
    parse: Parse = Parse.AS_GIVEN
    choices: tuple = ()                         # the values a choice may take (checked; the CLI's choices)
    shown: tuple = ()                           # the page dropdown's choices: labels, or (label, value) pairs
    start: object = None                        # what the page's box starts at (and an API caller leaving it out)
    place: Place | None = None                  # where the page shows it; None: not on the page
    api: str | None = None                      # its name as the page API's parameter (default: ``name``)
    modes: tuple[str, ...] = ("t2v", "t2i", "i2v", "v2v")   # the tabs whose form has it
    option: Option | None = None

    @property
    def api_name(self) -> str:
        return self.api or self.name


_NONE = type(None)
_NUMBER = (int, float)
_HOW_MANY_GPUS = ("split the job's denoise across N GPUs, one engine each (0: automatic, the default: one GPU "
                  "unless the model fits on the device only split)")

# In the page API's order: the Image to Video tab's images first, then the preset and prompts, the form's boxes,
# the seed, the plan panel's choices, the low-noise guidance (added last, so that older callers keep working);
# then the settings the page does not show.
FIELDS: tuple[Field, ...] = (
    Field("image", "First frame", Group.REQUEST, place=Place.IMAGES, modes=("i2v",),
          option=Option("--image", help="first frame: makes an image-to-video run", commands=("generate",))),
    Field("last_image", "Last frame", Group.REQUEST, place=Place.IMAGES, modes=("i2v",),
          option=Option("--last-image", help="optional last frame for image-to-video", commands=("generate",))),
    Field("preset", "Preset", Group.REQUEST, place=Place.PROMPTS),
    Field("prompt", "Prompt", Group.REQUEST, place=Place.PROMPTS),
    Field("negative_prompt", "Negative prompt", Group.REQUEST, place=Place.PROMPTS,
          option=Option("--negative-prompt", commands=("generate",))),
    Field("model", "Model", Group.REQUIRED, (str,), place=Place.FORM),
    Field("width", "Width", Group.REQUIRED, (int,), place=Place.FORM, option=Option("--width", int)),
    Field("height", "Height", Group.REQUIRED, (int,), place=Place.FORM, option=Option("--height", int)),
    Field("frames", "Frames", Group.REQUIRED, (int,), place=Place.FORM, option=Option("--frames", int)),
    Field("steps", "Steps", Group.REQUIRED, (int,), place=Place.FORM, option=Option("--steps", int)),
    Field("guidance", "Guidance", Group.REQUIRED, _NUMBER, place=Place.FORM,
          option=Option("--guidance", float, commands=("generate",))),
    Field("shift", "Shift", Group.REQUIRED, _NUMBER, place=Place.FORM,
          option=Option("--shift", float, commands=("generate",))),
    Field("seed", "Seed", Group.REQUEST, start=-1, place=Place.PROMPTS,
          option=Option("--seed", int, commands=("generate",))),
    Field("strategy", "Strategy", Group.MEMORY, (str, _NONE), Parse.AUTO, LADDER, (AUTO, *LADDER), AUTO, Place.PLAN,
          option=Option("--strategy", help="force a memory strategy (default: the planner's)")),
    Field("text_encoder", "Text encoder", Group.MEMORY, (str, _NONE), Parse.AUTO, TEXT_ENCODER_PLACES,
          (AUTO, *TEXT_ENCODER_PLACES), AUTO, Place.PLAN,
          option=Option("--text-encoder", help="force where the text encoder runs")),
    Field("vae_tiling", "VAE tiling", Group.MEMORY, (bool, _NONE), Parse.ON_OFF, (True, False), (AUTO, *ON_OFF),
          AUTO, Place.PLAN, option=Option("--vae-tiling", help="force VAE tiling on or off")),
    Field("decoder", "Decoder", Group.SPEED, (str,), Parse.FIRST, DECODERS,
          (("VAE (exact)", "vae"), ("VAE, faster (approximate)", "vae_fast"), ("Light VAE (approximate)", "vae_light"),
           ("Fast (approximate)", "fast")),
          "vae", Place.PLAN,
          option=Option("--decoder", help="vae: the model's own (default); vae_fast: the model's own with "
                                          "channels-last convolutions and several latent frames a call (up to a few "
                                          "levels off, 10-20%% faster); vae_light: LightX2V's pruned Wan2.1 VAE "
                                          "(approximate; Wan2.1 and Wan2.2-A14B); fast: the small approximate "
                                          "decoder, if installed")),
    Field("step_cache", "Step cache", Group.SPEED, (str, _NONE), Parse.OFF, STEP_CACHES,
          ((OFF, OFF), ("First block (approximate)", "first_block"), ("MagCache (approximate)", "mag"),
           ("TaylorSeer (approximate)", "taylor")), OFF, Place.PLAN,
          option=Option("--step-cache", help="reuse transformer work between steps (faster, approximate; default "
                                             "off)")),
    Field("compile", "Compile", Group.SPEED, (bool, _NONE), Parse.ON_OFF, (True, False), (AUTO, *ON_OFF), AUTO,
          Place.PLAN, option=Option("--compile", help="force compiling the transformer on or off")),
    Field("attention", "Attention", Group.SPEED, (str, _NONE), Parse.AUTO, ATTENTION_BACKENDS,
          (AUTO, *ATTENTION_BACKENDS), AUTO, Place.PLAN,
          option=Option("--attention", help="force an attention backend")),
    Field("vae_dtype", "VAE precision", Group.SPEED, (str, _NONE), Parse.AUTO, VAE_DTYPES, (AUTO, *VAE_DTYPES), AUTO,
          Place.PLAN, api="vae_precision",
          option=Option("--vae-precision", help="force the VAE decode's precision")),
    Field("loras", "LoRAs", Group.SOURCE, (list, tuple), Parse.LORAS, start="", place=Place.PLAN,
          option=Option("--lora", metavar="FILE[:STRENGTH][@high|@low]", many=True, dest="lora",
                        help="a LoRA file (.safetensors) and its strength (default 1.0), applied in order; give it "
                             "again for more; a bare name is also looked for in the models folder's loras/; "
                             "@high or @low puts it into one expert of a two-expert model (Wan2.2 A14B) only; "
                             "replaces the preset's LoRAs")),
    Field("transformer", "Transformer file", Group.SOURCE, (str, _NONE), Parse.OWN_FILE, start=OWN_TRANSFORMER,
          place=Place.PLAN,
          option=Option("--transformer", metavar="FILE",
                        help="a single transformer file (.gguf or .safetensors) in place of the model's own, a path "
                             "or a name in the models folder's transformers/; the rest (text encoder, VAE, ...) "
                             "comes from --model")),
    Field("transformer_2", "Low-noise transformer file", Group.SOURCE, (str, _NONE), Parse.OWN_FILE,
          start=OWN_TRANSFORMER, place=Place.PLAN,
          option=Option("--transformer-2", metavar="FILE",
                        help="the same for Wan2.2 A14B's low-noise expert (transformer_2)")),
    Field("gpus", "GPUs", Group.MEMORY, (int,), Parse.COUNT, start=AUTO, place=Place.PLAN,
          option=Option("--split", int, metavar="N", help=_HOW_MANY_GPUS, dest="split")),
    Field("guidance_2", "Guidance 2", Group.SOURCE, (int, float, _NONE), Parse.LOW_NOISE, start=0, place=Place.FORM,
          option=Option("--guidance-2", float, metavar="SCALE",
                        help="Wan2.2 A14B: the low-noise expert's guidance (default: the preset's, else the same as "
                             "--guidance; 0: the same as --guidance)")),
    Field("window", "Window (frames)", Group.RUN, (int,), Parse.COUNT, start=0, place=Place.FORM,
          option=Option("--window", int, metavar="FRAMES",
                        help="a video longer than this is denoised in overlapping windows of this many frames (4k+1; "
                             "default 0: the model's own, 81 for most)")),
    Field("overlap", "Overlap (frames)", Group.RUN, (int,), start=16, place=Place.FORM,
          option=Option("--overlap", int, metavar="FRAMES",
                        help="the frames neighbouring windows share at least (a multiple of 4, default 16)")),
    Field("count", "Videos", Group.RUN, (int,), start=1, place=Place.FORM,
          option=Option("--count", int, metavar="N", commands=("generate",),
                        help="make N videos (or stills), seeds SEED, SEED+1, ... (each random with --seed -1)")),
    Field("interpolate", "Smoother", Group.RUN, (int,), shown=(("Off", 1), ("2x frames", 2), ("4x frames", 4)),
          start=1, place=Place.FORM,
          option=Option("--interpolate", int, metavar="N",
                        help="after the video is written, N times its frames and fps (2 or 4; 1: off): RIFE 4.x from "
                             "models/interpolators/, else ffmpeg's minterpolate")),
    Field("upscale", "Larger", Group.RUN, (int,), shown=(("Off", 1), ("2x size", 2), ("4x size", 4)), start=1,
          place=Place.FORM,
          option=Option("--upscale", int, metavar="N",
                        help="after the video is written, N times its width and height (2 or 4; 1: off): an upscaler "
                             "model file from models/upscalers/, else Lanczos")),
    # Added after the settings above: positional API callers keep their places.
    Field("guidance_batch", "Guidance batch", Group.SPEED, (bool, _NONE), Parse.ON_OFF, (True, False),
          (AUTO, *ON_OFF), AUTO, Place.PLAN,
          option=Option("--guidance-batch", help="run a step's two guided passes as one batch (auto: on a GPU with "
                                                 "room for their activations)")),
    Field("compute", "Linears", Group.SPEED, (str,), Parse.FIRST, COMPUTES,
          (("Model's precision (exact)", "exact"), ("float8 (approximate)", "fp8")), "exact", Place.PLAN,
          option=Option("--compute", help="exact: the transformer's linears in the model's precision (default); "
                                          "fp8: in float8 through torchao, about 7%% faster a step and approximate, "
                                          "on GPUs with fp8 tensor cores (NVIDIA Ada, Hopper and newer; AMD MI300)")),
    # The videos a run starts from (after the settings above, so that older callers of the image-to-video API keep
    # working), and how much of a video-to-video input is made anew.
    Field("extend", "Video to extend", Group.REQUEST, place=Place.VIDEOS, modes=("i2v",),
          option=Option("--extend", metavar="VIDEO", commands=("generate",),
                        help="continue this mp4 (an output, or any video): a new part that starts from its last "
                             "frame, made with an image-to-video model, its colours matched, joined after it into one "
                             "mp4 (--frames: the new part's frames, the one it shares with the video included)")),
    Field("video", "Input video", Group.REQUEST, place=Place.VIDEOS, modes=("v2v",),
          option=Option("--video", metavar="VIDEO", commands=("generate",),
                        help="make this video again (video to video) with a text-to-video model, as the prompt "
                             "says: read at the model's fps, scaled and cropped to the size, its first --frames "
                             "frames")),
    Field("strength", "Strength", Group.RUN, _NUMBER, start=DEFAULT_VIDEO_STRENGTH, place=Place.FORM, modes=("v2v",),
          option=Option("--strength", float, metavar="S",
                        help=f"video to video: how much is made anew, 0 (the input back) to 1 (a new video from "
                             f"the prompt; default {DEFAULT_VIDEO_STRENGTH})")),
    Field("mode", "Mode", Group.REQUIRED, (str,)),
    Field("fps", "FPS", Group.REQUIRED, (int,), option=Option("--fps", int, commands=("generate",))),
    Field("scheduler", "Scheduler", Group.RUN, (str,)),
    Field("sigmas", "Sigmas", Group.RUN, (list, _NONE)),
)
FIELD = {field.name: field for field in FIELDS}
SETTING_FIELDS = tuple(field for field in FIELDS if field.group is not Group.REQUEST)
# How a preset file (JSON) holds each setting.
SETTING_TYPES = {field.name: field.json for field in SETTING_FIELDS}


def names_in(*groups: Group) -> tuple[str, ...]:
    """The settings of these groups, in the table's order."""
    return tuple(field.name for field in SETTING_FIELDS if field.group in groups)


def on_page(place: Place, mode: str = "t2v") -> tuple[Field, ...]:
    """The fields the page shows at ``place`` on the tab of ``mode``, in the table's order."""
    return tuple(field for field in FIELDS if field.place is place and mode in field.modes)


def api_fields(mode: str, places: tuple[Place, ...] = tuple(Place)) -> tuple[Field, ...]:
    """The page API's parameters of a generation endpoint of ``mode`` (text_to_video, image_to_video, ...), in
    order: every field the page shows on that tab at ``places``."""
    return tuple(field for field in FIELDS if field.place in places and mode in field.modes)


def plan_fields() -> tuple[Field, ...]:
    """The plan panel's inputs (and its API's parameters), in order: the preset, the form's model, size and
    frames, the panel's own choices, then the rest of the form (steps and guidance change the time it predicts;
    added after the panel's choices, so that older callers keep working)."""
    first = ("preset", "model", "width", "height", "frames")
    rest = tuple(field for field in on_page(Place.FORM) if field.name not in first)
    return (*(FIELD[name] for name in first), *on_page(Place.PLAN), *rest)


def cli_fields(command: str) -> tuple[Field, ...]:
    """The fields ``command`` (generate, plan) takes as options, in the table's order."""
    return tuple(field for field in FIELDS if field.option and command in field.option.commands)


def _blank(value) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def read(field: Field, value):
    """A raw value (a box's, an option's, an API argument) as the field's value; what does not read stays as it
    came, for the settings' check to say what is wrong with it."""
    parse = field.parse
    if parse is Parse.AS_GIVEN:
        return value
    if parse is Parse.LORAS:
        if isinstance(value, (list, tuple)) and all(isinstance(lora, Lora) for lora in value):
            return tuple(value)   # read already (the command line's --lora)
        return parse_lora_lines(None if _blank(value) else value)   # InputError for a line that does not read
    if parse is Parse.LOW_NOISE:
        return None if _blank(value) or (isinstance(value, _NUMBER) and not isinstance(value, bool) and value == 0) \
            else value
    if parse is Parse.FIRST:
        return field.choices[0] if _blank(value) else value
    if _blank(value) or value == AUTO:
        return 0 if parse is Parse.COUNT else None
    if parse is Parse.OFF:
        return None if value == OFF else value
    if parse is Parse.OWN_FILE:
        return None if value == OWN_TRANSFORMER else value
    if parse is Parse.COUNT:   # ASCII digits only ("²" is a digit to Python), a count's length ("9" * 5000 no int)
        digits = value.strip() if isinstance(value, str) else ""
        return int(digits) if digits.isascii() and digits.isdigit() and len(digits) <= 18 else value
    if parse is Parse.ON_OFF and isinstance(value, str):
        return {"on": True, "off": False}.get(value.strip().lower(), value)
    return value


def read_all(values: dict) -> dict:
    """``read`` for every value of ``values`` (by field name)."""
    unknown = sorted(set(values) - set(FIELD))
    if unknown:
        raise TypeError(f"not fields: {', '.join(unknown)}")
    return {name: read(FIELD[name], value) for name, value in values.items()}


def by_field(values: dict) -> dict:
    """Values by API parameter name (as a page endpoint receives them) by field name: vae_precision is vae_dtype."""
    names = {field.api_name: field.name for field in FIELDS}
    return {names[name]: value for name, value in values.items()}


def starting_values(fields: tuple[Field, ...]) -> dict:
    """{name: what the page's box starts at} for ``fields``."""
    return {field.name: field.start for field in fields}

