"""Sizes of weights on disk, read from safetensors headers only (no tensor is loaded), and the limits a header is
held to before it is parsed."""
from __future__ import annotations

import json
import os
import struct
from pathlib import Path

from engine.errors import InputError
from engine.models.components import Component

# The components whose weights a model folder holds: every one there is (tokenizer and scheduler have none).
WEIGHTED_COMPONENTS = tuple(Component)


# Header limits, about twice what the largest published Wan files need (docs/data/header-sizes.json, measured
# by bench/header_sizes.py on the released architectures): the most tensors, 2,322, and the longest tensor table,
# 293,760 bytes, are Wan2.1 VACE 14B in ComfyUI's "fp8 scaled" layout (a LoRA on every linear layer of Wan2.1
# I2V 14B: 2,279 and 275,856). A header above them is refused before it is parsed: an 871,560-tensor header of
# 98.5 MB took 13 s and 730 MB to parse, and far more in diffusers after it.
MAX_TENSORS = 5_000
TENSOR_TABLE_BYTES = 600_000
# Beside the tensors, training tools write their notes into ``__metadata__`` (kohya's tag counts grow with the
# dataset): not measured here, so a generous allowance.
METADATA_BYTES = 2_000_000
MAX_HEADER_BYTES = TENSOR_TABLE_BYTES + METADATA_BYTES
# How a tensor's entry starts in the header's JSON: counted in the raw bytes, before any parsing.
TENSOR_MARK = b'"data_offsets"'
# Bytes per element of the safetensors dtypes (F4/F6 and other packed types are not size-checked).
DTYPE_BYTES = {
    "F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2, "U16": 2,
    "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
}


class WeightFileError(ValueError):
    """A weight file is damaged (truncated, or its header is garbage); the message says how."""


def read_header(path: Path) -> dict:
    """The JSON header of a ``.safetensors`` file, checked against the file's size (no tensor is read).

    Raises WeightFileError saying what is wrong: too short, an impossible header length, a header
    that is not JSON, a tensor entry that makes no sense, or data that ends past (or before) the
    end of the file, as a truncated download does.
    """
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        def read(start: int, count: int) -> bytes:
            f.seek(start)
            return f.read(count)
        return parse_header(read, size)


def parse_header(read, size: int) -> dict:
    """The header of a safetensors file of ``size`` bytes whose bytes ``read(start, count)`` gives (a file on
    disk, or one on the Hub read by ranges before it is downloaded), checked as read_header says."""
    if size < 8:
        raise WeightFileError(f"it is {size} bytes long, too short for a safetensors file")
    (length,) = struct.unpack("<Q", read(0, 8))
    first = read(8, 1)
    _check_length(length, size, first)
    raw = first + read(9, length - 1)
    if len(raw) != length:
        raise WeightFileError("its header runs past the end of the file: the file is cut short")
    return _parsed(raw, length, size)


def _parsed(raw: bytes, length: int, size: int) -> dict:
    _check_tensor_count(raw)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WeightFileError(f"its header is not valid JSON ({exc.__class__.__name__})") from None
    if not isinstance(header, dict):
        raise WeightFileError("its header is not a JSON object")
    data_end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        shape = info.get("shape") if isinstance(info, dict) else None
        if (not isinstance(offsets, list) or len(offsets) != 2 or not isinstance(shape, list)
                or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (*offsets, *shape))
                or offsets[0] > offsets[1]):
            raise WeightFileError(f"its header entry for tensor {name!r} is malformed")
        per_element = DTYPE_BYTES.get(info.get("dtype"))
        if per_element is not None:
            count = 1
            for dim in shape:
                count *= dim
            if offsets[1] - offsets[0] != count * per_element:
                raise WeightFileError(f"its header entry for tensor {name!r} does not match the tensor's shape")
        data_end = max(data_end, offsets[1])
    expected = 8 + length + data_end
    if expected > size:
        raise WeightFileError(
            f"it is {size:,} bytes but its header says the data ends at byte {expected:,}; the file is cut short")
    if expected < size:
        raise WeightFileError(f"it has {size - expected:,} bytes more than its header describes")
    return header


def megabytes(nbytes: int) -> str:
    """'98.5 MB', '0.6 MB': a size in messages."""
    return f"{nbytes / 1e6:,.1f} MB"


def _check_length(length: int, size: int, first: bytes) -> None:
    """Refuse a header length that cannot be: past the end of the file (a file that is no safetensors one, whose
    first bytes read as a number, or one cut short inside its header), or above MAX_HEADER_BYTES."""
    plausible = 2 <= length <= size - 8
    if not plausible or length > MAX_HEADER_BYTES:
        if first != b"{":
            raise WeightFileError("it is not a safetensors file (it does not begin with a safetensors header)")
        if not plausible:
            raise WeightFileError("its header runs past the end of the file: the file is cut short")
        raise WeightFileError(
            f"its header is {megabytes(length)}, more than the {megabytes(MAX_HEADER_BYTES)} that any Wan model's or "
            "LoRA's file needs: the file is damaged or is not a Wan weight file")


def _check_tensor_count(raw: bytes) -> None:
    """Refuse a header listing more than MAX_TENSORS tensors, counted before it is parsed."""
    count = raw.count(TENSOR_MARK)
    if count > MAX_TENSORS:
        raise WeightFileError(
            f"its header lists {count:,} tensors, more than the {MAX_TENSORS:,} that any Wan model's or LoRA's "
            "file holds: the file is damaged or is not a Wan weight file")


# A component's headers: {file name: its safetensors header}.
Headers = dict[str, dict]


def component_headers(folder: Path) -> dict[str, Headers]:
    """The safetensors headers of every weighted component of a diffusers folder, by component and file name."""
    found = {}
    for name in WEIGHTED_COMPONENTS:
        part = Path(folder) / name
        if part.is_dir():
            files = {path.name: read_header(path) for path in sorted(part.glob("*.safetensors"))}
            if files:
                found[name] = files
    return found


def elements(shape) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def tensor_params(headers: Headers) -> dict[str, int]:
    """Parameter count of every tensor of a component's files."""
    return {name: elements(info["shape"]) for header in headers.values() for name, info in header.items()
            if name != "__metadata__"}


def stored_bytes_per_param(headers: Headers) -> float:
    """How wide a component is stored: its data bytes over its parameters (4 for float32 files, 2 for bf16)."""
    data = params = 0
    for header in headers.values():
        for name, info in header.items():
            if name != "__metadata__":
                count = elements(info["shape"])
                data += info["data_offsets"][1] - info["data_offsets"][0]
                params += count
    return data / params if params else 0.0


def file_data_bytes(header: dict) -> int:
    """The tensor bytes one file holds (its size without the header)."""
    return max((info["data_offsets"][1] for name, info in header.items() if name != "__metadata__"), default=0)


def component_tensors(folder: Path) -> dict[str, dict[str, int]]:
    """Parameter count of every tensor, per weighted component of a diffusers folder (headers read once)."""
    return {name: tensor_params(headers) for name, headers in component_headers(folder).items()}


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pth", ".pt", ".gguf")


def weight_bytes(folder: Path, components: tuple[str, ...] = WEIGHTED_COMPONENTS) -> int:
    """Bytes of the weight files a load of ``folder`` reads (links followed, as the hub cache uses them)."""
    total = 0
    for name in components:
        part = Path(folder) / name
        if part.is_dir():
            total += sum(path.stat().st_size for path in part.iterdir()
                         if path.suffix in WEIGHT_SUFFIXES and path.is_file())
    return total


def files_under(folder: Path, suffixes: tuple[str, ...]) -> list[str]:
    """The files in ``folder`` and its subfolders whose suffix is one of ``suffixes`` (any case), as paths relative
    to it, sorted as a person reads them; none when the folder is not there. Only names: nothing is read."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted((path.relative_to(folder).as_posix() for path in folder.rglob("*")
                   if path.suffix.lower() in suffixes and path.is_file()), key=str.lower)


def find_file(file: str, folder: Path, must_exist: bool = False) -> str:
    """A file the command line names, as an absolute path: as given (from the working folder), else by that name in
    ``folder`` (the models folder's loras/ or transformers/). A weights file in neither is refused naming both
    (InputError), unless it need not exist yet (``must_exist`` False: a preset's LoRA the engine fetches), when it
    is returned as given."""
    path = Path(file).expanduser()
    if path.is_absolute() or path.exists():
        return os.path.abspath(path)
    in_folder = Path(folder) / path
    if in_folder.is_file():
        return str(in_folder.resolve())
    if must_exist and path.suffix.lower() in (".safetensors", ".gguf"):   # the check would name only one place
        raise InputError(f"{file} is neither in this folder ({os.getcwd()}) nor in {Path(folder).resolve()}: "
                         f"check its name, or put it in {Path(folder).resolve()}")
    return os.path.abspath(path)
