"""A single transformer file in place of a model's own: what its header says, read without loading a weight.

People download Wan transformers as one file: GGUF (quantised: Q8_0, Q5_K_M, Q4_K_M, ...) or one
``.safetensors`` (bf16, fp16, fp8, ComfyUI's "fp8 scaled"), in the original Wan key layout
(``blocks.0.self_attn.q.weight``, ``patch_embedding.weight``, ``head.head.weight``, with or without a
``model.diffusion_model.`` prefix). The rest of the pipeline comes from the settings' model (the base).

Here the file's header tells its kind, quantisation, bytes and parameters, and the transformer shape it
implies (width from ``patch_embedding.weight``, input channels, layers), so that a file that does not match
the base model's transformer is refused with a sentence before anything loads, and the planner counts the
bytes the file really takes (``ModelSpec.transformer_files``).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

from engine.models.gguf_header import GGUFHeaderError, check_gguf_header
from engine.models.refs import ResolvedModel
from engine.models.spec import KNOWN_MODELS, TRANSFORMERS, ModelSpec, TransformerShape, TransformerWeights
from engine.models.weights import WEIGHTED_COMPONENTS, WeightFileError, files_under, read_header, weight_bytes
from engine.errors import InputError

PREFIX = "model.diffusion_model."          # ComfyUI's checkpoints put the transformer under it
# GGUF tensor types diffusers 0.42 dequantises (diffusers/quantizers/gguf/utils.py); F32 and F16 load as
# ordinary tensors at the compute dtype.
GGUF_PLAIN = ("F32", "F16")
GGUF_QUANTISED = ("BF16", "Q8_0", "Q6_K", "Q5_K", "Q5_1", "Q5_0", "Q4_K", "Q4_1", "Q4_0", "Q3_K", "Q2_K",
                  "IQ4_NL", "IQ4_XS")
# safetensors dtypes a single file may hold (diffusers casts them to the compute dtype as it loads).
SAFETENSORS_FLOATS = {"F32": "fp32", "F16": "fp16", "BF16": "bf16", "F8_E4M3": "fp8_e4m3fn", "F8_E5M2": "fp8_e5m2"}
# ComfyUI's "fp8 scaled" files: a marker tensor, and per weight a scale to multiply it by.
SCALED_MARKER = "scaled_fp8"
SCALE_SUFFIXES = (".scale_weight", ".scale_input")
# ComfyUI's newer layout (its QUANTIZATION.md): per quantised layer ``<layer>.weight_scale`` (and an activation
# ``<layer>.input_scale``), the layers and their formats listed in the header's ``_quantization_metadata``.
WEIGHT_SCALE, INPUT_SCALE = ".weight_scale", ".input_scale"
QUANT_METADATA = "_quantization_metadata"
# The formats of that layout whose weight is the stored value times one scale: what the loader multiplies back.
PER_TENSOR_FP8 = ("float8_e4m3fn", "float8_e5m2")
# Every tensor name that holds a scale (or the marker), not a weight.
SCALE_NAMES = (SCALED_MARKER, *SCALE_SUFFIXES, WEIGHT_SCALE, INPUT_SCALE)
# FLF2V's position embedding of its two images' tokens, as the original files name it, and as diffusers does
# (its single-file converter has no entry for it: the load would leave diffusers' one empty).
FIRST_LAST_EMBEDDING = "img_emb.emb_pos"
DIFFUSERS_FIRST_LAST_EMBEDDING = "condition_embedder.image_embedder.pos_embed"
# A single transformer file in place of the model's own: its suffixes, and how a message names each expert's.
TRANSFORMER_FILE_SUFFIXES = (".gguf", ".safetensors")
TRANSFORMER_FILE_NAMES = {"transformer": "transformer file", "transformer_2": "low-noise transformer file"}
# Inside the models folder: where the page lists single transformer files (and finds one given by name).
TRANSFORMERS_FOLDER = "transformers"


@dataclass(frozen=True)
class TransformerFile:
    """A Wan transformer in one file, as its header describes it (no tensor read)."""
    path: str                # absolute
    kind: str                # "gguf" or "safetensors"
    quantization: str        # the (quantised) type holding most bytes: "Q8_0", "Q4_K", "bf16", "fp8_e4m3fn scaled"
    total_bytes: int         # bytes of its tensors as stored
    params: int
    quantized_params: int    # parameters that stay quantised once loaded (GGUF's quantised tensors)
    quantized_bytes: int
    width: int               # the transformer's hidden size (patch_embedding.weight's output channels)
    in_channels: int         # 16 text to video, 36 image to video, 48 Wan2.2-5B
    layers: int
    ffn: int | None          # the feed-forward width, when the file's layout shows it
    file_bytes: int
    mtime_ns: int
    scaled_fp8: bool = False   # ComfyUI's fp8 with a scale per weight: the loader multiplies them back
    first_last: bool = False   # holds FLF2V's position embedding (FIRST_LAST_EMBEDDING)
    given: str = ""            # the path as the settings name it (a link's own name, not its target's)

    @property
    def name(self) -> str:
        return Path(self.given or self.path).name

    @property
    def source(self) -> tuple[str, int, int]:
        """What identifies this version of the file: another path, size or modification time is another load."""
        return self.path, self.file_bytes, self.mtime_ns

    def weights(self) -> TransformerWeights:
        """How the planner counts it: quantised bytes as stored; a safetensors file is read whole, then cast."""
        return TransformerWeights(self.source, self.quantization, self.params, self.quantized_params,
                                  self.quantized_bytes, self.total_bytes if self.kind == "safetensors" else 0)

    def shape_words(self) -> str:
        return f"width {self.width}, {self.layers} layers, {self.in_channels} input channels"

    def mismatch(self, shape: TransformerShape, model: str) -> str | None:
        """One sentence when this file cannot stand in for ``model``'s transformer of ``shape``, else None."""
        ffn_differs = self.ffn is not None and self.ffn != shape.ffn
        if (self.width, self.layers, self.in_channels) == (shape.dim, shape.layers, shape.in_channels) \
                and not ffn_differs:
            return self._first_last_mismatch(shape, model)
        like = _known_name(self.width, self.layers, self.in_channels)
        ffn_words = (f", feed-forward {self.ffn}", f", feed-forward {shape.ffn}") if ffn_differs else ("", "")
        return (f"the transformer file {self.name} is shaped like {like or 'another model'} ({self.shape_words()}"
                f"{ffn_words[0]}), but {model}'s transformer has width {shape.dim}, {shape.layers} layers, "
                f"{shape.in_channels} input channels{ffn_words[1]}: choose a file made for {model}, or "
                + (f"pick the {like} model to use this file" if like else "the model the file was made for"))


    def _first_last_mismatch(self, shape: TransformerShape, model: str) -> str | None:
        """The sentence when only FLF2V's position embedding tells this file and ``model``'s transformer apart."""
        if self.first_last == shape.first_last:
            return None
        if self.first_last:
            return (f"the transformer file {self.name} is a first-and-last-frame (FLF2V) transformer (it holds "
                    f"{FIRST_LAST_EMBEDDING}), but {model} takes one image: pick the Wan2.1 FLF2V 14B 720P model "
                    "to use this file, or choose an image-to-video file")
        return (f"the transformer file {self.name} has no {FIRST_LAST_EMBEDDING}, the position embedding of "
                f"{model}'s first and last frames: it is an image-to-video file; choose an FLF2V file, or pick "
                "the Wan2.1 I2V 14B model to use this one")


def _known_name(width: int, layers: int, in_channels: int) -> str | None:
    """'Wan2.1 T2V 1.3B' for a shape one of the known models has."""
    for spec in KNOWN_MODELS.values():
        shape = spec.transformer
        if (shape.dim, shape.layers, shape.in_channels) == (width, layers, in_channels):
            return spec.name
    return None


class _Problem(Exception):
    """What is wrong with a transformer file, as a clause about it ("is not a GGUF file ...")."""


def _refused(name: str, reason: str) -> InputError:
    return InputError(f"the transformer file {name} {reason}")


def read_transformer_file(path: str | Path) -> TransformerFile:
    """The header of a ``.gguf`` or ``.safetensors`` transformer file; InputError saying what is wrong, naming the
    file as given (never the target of a link, nor the folders above it)."""
    given = Path(path).expanduser()
    try:
        return _read_transformer_file(given)
    except _Problem as exc:
        raise _refused(given.name, str(exc)) from None


def _read_transformer_file(given: Path) -> TransformerFile:
    path = given.resolve()
    try:
        stat = path.stat()
    except OSError as exc:
        raise _Problem(f"cannot be read ({exc.strerror or exc}): check the path") from None
    suffix = given.suffix.lower()   # a link's own (a hub cache's blobs have none)
    if suffix not in TRANSFORMER_FILE_SUFFIXES:
        raise _Problem("is not a .gguf or .safetensors file: give a single transformer file in one of those formats")
    if suffix == ".gguf":
        tensors, quantised, scaled = _gguf_tensors(path, stat.st_size), True, False
    else:
        tensors, scaled = _safetensors_tensors(path)
        quantised = False
    return replace(_describe(path, stat, tensors, quantised, scaled), given=str(given))


def _gguf_tensors(path: Path, size: int) -> dict[str, tuple[str, tuple[int, ...], int, int]]:
    """{name: (type, shape, elements, bytes)} from a GGUF file's header (its tensors are mapped, never read); the
    header's counts and lengths are checked first, before the reader allocates for them."""
    import gguf

    try:
        check_gguf_header(path)
    except GGUFHeaderError as exc:
        raise _Problem(str(exc)) from None
    except OSError as exc:
        raise _Problem(f"cannot be read ({exc.strerror or exc})") from None
    try:
        reader = gguf.GGUFReader(path)
        tensors = {}
        for tensor in reader.tensors:
            shape = _gguf_original_shape(reader, tensor.name) or tuple(int(d) for d in reversed(tensor.shape))
            if int(tensor.data_offset) + int(tensor.n_bytes) > size:
                raise _Problem("is not a readable GGUF file (its data ends past the end of the file: it is cut "
                               "short); download it again")
            tensors[tensor.name] = (tensor.tensor_type.name, shape, int(tensor.n_elements), int(tensor.n_bytes))
    except (ValueError, IndexError, KeyError, TypeError, OverflowError, OSError) as exc:
        raise _Problem(f"is not a readable GGUF file ({type(exc).__name__}): it may be damaged; download it "
                       "again") from None
    unknown = sorted({kind for kind, *_ in tensors.values() if kind not in GGUF_PLAIN + GGUF_QUANTISED})
    if unknown:
        raise _Problem(f"holds tensors in {', '.join(unknown)}, which diffusers cannot load: use a file in "
                       f"{', '.join(('Q8_0', 'Q6_K', 'Q5_K_M', 'Q4_K_M'))} or another of {', '.join(GGUF_QUANTISED)}")
    return tensors


def _gguf_original_shape(reader, name: str) -> tuple[int, ...] | None:
    """The shape ComfyUI's converter recorded for a tensor it reshaped to quantise it."""
    field = reader.get_field(f"comfy.gguf.orig_shape.{name}")
    if field is None:
        return None
    return tuple(int(field.parts[index][0]) for index in field.data)


def _safetensors_tensors(path: Path) -> tuple[dict[str, tuple[str, tuple[int, ...], int, int]], bool]:
    """({name: (dtype, shape, elements, bytes)}, whether it is ComfyUI's fp8 scaled) from the header."""
    try:
        header = read_header(path)
    except WeightFileError as exc:
        raise _Problem(f"is damaged: {exc}; download it again") from None
    except OSError as exc:
        raise _Problem(f"cannot be read ({exc.strerror or exc})") from None
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        count = 1
        for dim in info["shape"]:
            count *= dim
        start, end = info["data_offsets"]
        tensors[name] = (str(info.get("dtype")), tuple(info["shape"]), count, end - start)
    scaled = any(name.endswith(SCALED_MARKER) or name.endswith(SCALE_SUFFIXES[0]) for name in tensors)
    if any(name.endswith(WEIGHT_SCALE) for name in tensors):
        _check_quantization_layout(header.get("__metadata__") or {}, tensors)
        scaled = True
        for name in [n[:-len(WEIGHT_SCALE)] + ".weight" for n in tensors if n.endswith(WEIGHT_SCALE)]:
            if name in tensors and tensors[name][0] == "U8":   # fp8 bytes kept in a uint8 container
                tensors[name] = ("F8_E4M3", *tensors[name][1:])
    weights = {n: kind for n, (kind, *_) in tensors.items() if not n.endswith(SCALE_NAMES)}
    unknown = sorted(set(weights.values()) - set(SAFETENSORS_FLOATS))
    if unknown:
        raise _Problem(f"holds {', '.join(unknown)} tensors, a quantisation diffusers cannot read from a single "
                       "safetensors file: use a GGUF file, or a bf16, fp16 or fp8 safetensors one")
    return tensors, scaled


def _check_quantization_layout(metadata: dict, tensors: dict) -> None:
    """ComfyUI's newer fp8 layout, readable only when every quantised layer is fp8 with one scale per weight (the
    loader multiplies it back); anything else is refused here, before a load that would run the stored values
    with their scales dropped."""
    import json

    listed = metadata.get(QUANT_METADATA)
    layers = {}
    if listed is not None:
        try:
            layers = json.loads(listed).get("layers") or {} if isinstance(listed, str) else listed.get("layers") or {}
        except (ValueError, AttributeError):
            raise _Problem(f"has a {QUANT_METADATA} entry that is not JSON the app can read; download it again") \
                from None
    formats = sorted({str(config.get("format")) for config in layers.values() if isinstance(config, dict)}
                     - set(PER_TENSOR_FP8))
    if formats:
        raise _Problem(f"is quantised as {', '.join(formats)} (ComfyUI's {QUANT_METADATA}), which the app cannot "
                       "read from a single safetensors file: use a GGUF file, or a bf16, fp16 or fp8 one")
    grouped = sorted(name for name, (_, _, count, _) in tensors.items() if name.endswith(WEIGHT_SCALE) and count != 1)
    if grouped:
        _, shape, count, _ = tensors[grouped[0]]
        layer = grouped[0][:-len(WEIGHT_SCALE)].removeprefix(PREFIX)
        raise _Problem(f"scales {layer} by {count} values (shape {list(shape)}){f' and {len(grouped) - 1} more layers so' if len(grouped) > 1 else ''}, "
                       "a layout the app cannot read: use a GGUF file, or a bf16, fp16 or fp8 safetensors one")


def _describe(path: Path, stat: os.stat_result, tensors: dict, gguf: bool, scaled: bool) -> TransformerFile:
    if any(name.startswith(PREFIX) for name in tensors):
        tensors = {name[len(PREFIX):]: info for name, info in tensors.items() if name.startswith(PREFIX)}
    patch = tensors.get("patch_embedding.weight")
    if patch is None or len(patch[1]) != 5:
        raise _Problem("holds no patch_embedding.weight of a Wan transformer: it is not a Wan transformer file (a "
                       "LoRA, another model, or one shard of several?); give a whole Wan transformer")
    layers = 1 + max((int(name.split(".")[1]) for name in tensors
                      if name.startswith("blocks.") and name.split(".")[1].isdigit()), default=-1)
    ffn = tensors.get("blocks.0.ffn.0.weight") or tensors.get("blocks.0.ffn.net.0.proj.weight")
    quantised = {n: info for n, info in tensors.items() if gguf and info[0] not in GGUF_PLAIN}
    by_kind: dict[str, int] = {}
    for kind, _, _, nbytes in (quantised or tensors).values():   # a GGUF file is named by its quantised types
        by_kind[kind] = by_kind.get(kind, 0) + nbytes
    main = max(by_kind, key=by_kind.get)
    quantization = main if gguf else SAFETENSORS_FLOATS.get(main, main) + (" scaled" if scaled else "")
    return TransformerFile(
        path=str(path), kind="gguf" if gguf else "safetensors", quantization=quantization,
        total_bytes=sum(info[3] for info in tensors.values()), params=sum(info[2] for info in tensors.values()),
        quantized_params=sum(info[2] for info in quantised.values()),
        quantized_bytes=sum(info[3] for info in quantised.values()),
        width=int(patch[1][0]), in_channels=int(patch[1][1]), layers=layers,
        ffn=int(ffn[1][0]) if ffn else None, file_bytes=stat.st_size, mtime_ns=stat.st_mtime_ns, scaled_fp8=scaled,
        first_last=FIRST_LAST_EMBEDDING in tensors)


# ----- the models folder's transformers/ -------------------------------------------------------------
def transformer_folder(models_dir: str | Path) -> Path:
    return Path(models_dir) / TRANSFORMERS_FOLDER


def listed_transformer_files(models_dir: str | Path) -> list[str]:
    """The .gguf and .safetensors files in the models folder's transformers/ (and its subfolders), as paths
    relative to it, sorted; none when the folder is not there. Only names: no header is read."""
    return files_under(transformer_folder(models_dir), tuple(TRANSFORMER_FILE_SUFFIXES))


# ----- a model with its transformer files ------------------------------------------------------------
def transformer_paths(settings) -> tuple[str | None, ...]:
    """The settings' single transformer files, one per expert (None: the model's own)."""
    return tuple((getattr(settings, name, None) or "").strip() or None for name in TRANSFORMERS)


def check_transformer_files(spec: ModelSpec, files: tuple[TransformerFile | None, ...], model: str) -> None:
    """InputError, one sentence per problem, when a file cannot stand in for ``model``'s transformers."""
    problems = []
    for expert, file in enumerate(files):
        if file is None:
            continue
        if expert >= spec.experts:
            problems.append(f"the low-noise transformer file {file.name} has no place in {model}: it has one "
                            "transformer, no low-noise expert; remove it, or give it as the transformer file")
            continue
        problem = file.mismatch(spec.transformer, model)
        if problem:
            problems.append(problem)
    if problems:
        raise InputError(problems)


def spec_with_files(spec: ModelSpec, files: tuple[TransformerFile | None, ...]) -> ModelSpec:
    """``spec`` with these files in place of its transformers (none: the model's own, whatever it had before)."""
    weights = tuple(file.weights() if file is not None else None for file in files[:spec.experts])
    return replace(spec, transformer_files=weights if any(weights) else ())


def use_transformer_files(resolved: ResolvedModel, files: tuple[TransformerFile | None, ...]) -> ResolvedModel:
    """``resolved`` with these single transformer files (read by the catalog: ModelCatalog.transformer_files)
    checked against its transformer and counted in its spec; InputError before anything loads when one does not
    fit."""
    name = resolved.spec.name if resolved.spec else resolved.ref
    if resolved.spec is not None:
        check_transformer_files(resolved.spec, files, name)
    spec = spec_with_files(resolved.spec, files) if resolved.spec is not None else None
    return replace(resolved, spec=spec, transformer_files=files)


def read_bytes(resolved: ResolvedModel) -> int:
    """Bytes a load of ``resolved`` reads: its folder's weights, a single file in place of each transformer."""
    files = dict(zip(TRANSFORMERS, resolved.transformer_files))
    own = tuple(name for name in WEIGHTED_COMPONENTS if files.get(name) is None)
    return weight_bytes(resolved.folder, own) + sum(file.file_bytes for file in files.values() if file is not None)
