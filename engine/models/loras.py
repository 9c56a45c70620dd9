"""LoRA files, judged from their safetensors header alone (no tensor is read, nothing is imported).

diffusers reads three layouts of Wan LoRA (``WanLoraLoaderMixin.lora_state_dict``): its own and PEFT's
(``transformer.blocks.0.attn1.to_q.lora_A.weight``), the original Wan names that Kijai, ComfyUI and lightx2v
save (``diffusion_model.blocks.0.self_attn.q.lora_down.weight`` with ``.alpha`` and ``.diff_b``), and
musubi-tuner's (``lora_unet_blocks_0_self_attn_q.lora_down.weight``). A file in none of them, or no LoRA at
all (a model, a VAE), is refused here with a sentence, before any job loads anything. Whether its layers
fit the chosen model is known only once the model is loaded (engine/run/lora.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from engine.models.lora_layout import OTHER_KINDS
from engine.models.weights import WeightFileError, read_header

LORA_SUFFIX = ".safetensors"
# The tensor names of a LoRA's factors, and the ends of its alphas and of the differences some layouts add.
_LORA_PARTS = ("lora_A", "lora_B", "lora_down", "lora_up")
_LORA_ENDS = (".alpha", ".diff", ".diff_b")
# Each layout diffusers converts for Wan: (its first key's prefix, what a key of a Wan layer starts with).
LAYOUTS = {
    "diffusers": ("transformer.", "transformer."),
    "Wan original (Kijai, ComfyUI, lightx2v)": ("diffusion_model.", "diffusion_model.blocks."),
    "musubi-tuner": ("lora_unet_", "lora_unet_blocks_"),
    "Wan original without a prefix": ("blocks.", "blocks."),
}
MADE_FOR_WAN = "pick a LoRA made for Wan (in diffusers', ComfyUI's or musubi-tuner's layout)"
# Which transformer of a two-expert model (Wan2.2 A14B) a LoRA goes into: both, the high-noise one
# (``transformer``: the first steps) or the low-noise one (``transformer_2``: the last steps).
LORA_EXPERTS = ("both", "high", "low")


@dataclass(frozen=True)
class Lora:
    """One LoRA of a run: its file, its strength, the expert it goes into, and where it is published.

    ``file``: a path, or a name in the models folder's ``loras/``. ``repo`` and ``path``: a Hugging Face Hub
    repository and the file's path in it, from which a missing file is fetched once (a preset's LoRAs).
    """
    file: str
    strength: float = 1.0
    expert: str = "both"
    repo: str | None = None
    path: str | None = None

    @property
    def name(self) -> str:
        return Path(self.file.replace("\\", "/")).name

    @property
    def shown(self) -> str:
        """How a message names it: 'detail.safetensors' or 'detail.safetensors (high-noise expert)'."""
        return self.name if self.expert == "both" else f"{self.name} ({self.expert}-noise expert)"

    @property
    def fetchable(self) -> bool:
        return bool(self.repo and self.path)


def as_lora(entry) -> Lora:
    """A Lora from what settings hold (a Lora), what older files and callers give (a (file, strength) pair, a
    (file, strength, expert) triple) or a preset's JSON object; ValueError saying what to write otherwise.
    The values themselves are checked by ``values.check_settings``."""
    if isinstance(entry, Lora):
        return entry
    if isinstance(entry, dict):
        unknown = sorted(set(entry) - {"file", "strength", "expert", "repo", "path"})
        if unknown or "file" not in entry:
            raise ValueError(f"a LoRA is an object with 'file' and optionally 'strength', 'expert', 'repo' and "
                             f"'path'; got {', '.join(unknown) or 'no file'}")
        return Lora(**{"strength": 1.0, **entry})
    if isinstance(entry, (list, tuple)) and len(entry) in (2, 3):
        return Lora(*entry)
    raise ValueError(f"a LoRA is a (file, strength) pair, got {str(entry)[:60]!r}")


def lora_layout(keys: list[str]) -> str | None:
    """The name of the layout ``keys`` are in (a LAYOUTS key), or None when diffusers reads none of them for Wan."""
    for name, (prefix, wan) in LAYOUTS.items():
        if any(k.startswith(prefix) for k in keys):
            # musubi's converter takes every key for a block of Wan's: an SDXL file (lora_unet_down_blocks_...)
            # would break it, so all of them must be; the others need one layer of Wan's at least.
            ours = [k.startswith(wan) for k in keys if k.startswith(prefix)]
            return name if (all(ours) if name == "musubi-tuner" else any(ours)) else None
    return None


def lora_file_problem(file: str, fetchable: bool = False) -> str | None:
    """What is wrong with ``file`` as a Wan LoRA (a clause saying what to change), or None when it reads as one.
    ``fetchable``: the file may be missing yet, since the engine fetches it before the run (a preset's LoRA)."""
    path = Path(file).expanduser()
    name = path.name
    if path.suffix.lower() != LORA_SUFFIX:
        return (f"LoRA file {name!r} is not a {LORA_SUFFIX} file: use the {LORA_SUFFIX} version of the LoRA "
                "(other formats can run code when they are read)")
    if fetchable and not path.exists():
        return None
    if not path.is_file():
        return f"LoRA file {str(path)!r} is not there: check its name and folder"
    try:
        header = read_header(path)
    except WeightFileError as exc:
        return f"LoRA file {name!r} cannot be read: {exc}; download it again"
    except OSError as exc:   # its words alone: the error's own text names the whole path
        return f"LoRA file {name!r} cannot be read ({exc.strerror or type(exc).__name__}): check the file"
    keys = [key for key in header if key != "__metadata__"]
    other = sorted({kind for key in keys for marker, kind in OTHER_KINDS.items() if marker in key})
    if other:
        return (f"LoRA file {name!r} holds {', '.join(other)} tensors, which the app does not apply: use a plain "
                "LoRA (lora_down/lora_up or lora_A/lora_B factors)")
    if not any(key.endswith(_LORA_ENDS) or any(part in key for part in _LORA_PARTS) for key in keys):
        return (f"{name!r} is not a LoRA (none of its {len(keys)} tensors is a lora_A/lora_B or lora_down/lora_up "
                "weight): give a LoRA file, not a model")
    if lora_layout(keys) is None:
        example = min(keys, key=len) if keys else ""
        return (f"{name!r} is not a LoRA for Wan (its layers, such as {example!r}, are not a Wan transformer's): "
                f"{MADE_FOR_WAN}")
    return None
