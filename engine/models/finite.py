"""Weight files holding values that are no numbers (NaN) or infinite: damaged, found as the engine reads them.

A model run with such a weight denoises to NaN, which a video encoder writes as black frames: the job would end
"done" with an empty video. So each file a job brings besides the model's own folder is looked at before it is
used: a LoRA (tens to hundreds of MB) and a fast decoder (22 MB) in full; a transformer file of many GB sampled:
SAMPLE_ELEMENTS values at the start and SAMPLE_ELEMENTS at the middle of every tensor (whole rows of it,
dequantised for GGUF's types), about 20 MB of a 14B file, where the load reads all of it. That finds a file of
NaN, a tensor of them, or damage across the middle of a tensor; not a single value elsewhere (the latents' check
after the denoise catches what that does).

Torch and gguf are imported inside the functions.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from engine.models.weights import read_header
from engine.errors import InputError
from engine.words import value_kinds

# Values read at the start and at the middle of each tensor of a transformer file (rounded up to whole rows).
SAMPLE_ELEMENTS = 4096
# A tensor name from a file is shown at most this long.
MAX_NAME_CHARS = 80
TRANSFORMER_TODO = "download it again, or clear the transformer file to use the model's own transformer"


@dataclass(frozen=True)
class Scan:
    """What a look at a file's tensors found: how many were looked at, those holding NaN or infinite values."""
    checked: int
    bad: tuple[str, ...] = ()
    nan: bool = False
    inf: bool = False
    sampled: bool = False

    def problem(self, what: str, todo: str) -> str | None:
        """'the LoRA x.safetensors holds NaN values in 3 of its 200 tensors (first: blocks.0...): it is damaged;
        <todo>', or None when every value looked at is a finite number."""
        if not self.bad:
            return None
        kinds = value_kinds(self.nan, self.inf)
        among = f"the {self.checked:,} tensors sampled" if self.sampled else f"its {self.checked:,} tensors"
        first = self.bad[0] if len(self.bad[0]) <= MAX_NAME_CHARS else self.bad[0][:MAX_NAME_CHARS] + "…"
        return f"{what} holds {kinds} values in {len(self.bad):,} of {among} (first: {first}): it is damaged; {todo}"


def nonfinite(values) -> tuple[float, bool, bool] | None:
    """(the share of ``values`` that are no finite numbers, whether any is NaN, whether any is infinite), or None
    when every one is a finite number (a torch tensor, on any device; integers are always numbers)."""
    import torch

    if not values.is_floating_point() or not values.numel():
        return None
    if values.dtype.itemsize == 1:   # the fp8 types: no reductions of their own
        values = values.float()
    # The smallest and largest value, one pass (50 times faster than isfinite on the CPU): NaN and ±inf show there.
    low, high = torch.aminmax(values)
    if bool(torch.isfinite(low) & torch.isfinite(high)):
        return None
    finite = torch.isfinite(values)
    return 1.0 - float(finite.float().mean()), bool(torch.isnan(values).any()), bool(torch.isinf(values).any())


def scan(tensors: Iterable[tuple[str, object]], sampled: bool = False) -> Scan:
    """Scan (name, torch tensor) pairs in order: each tensor looked at whole."""
    checked, bad, nan, inf = 0, [], False, False
    for name, values in tensors:
        checked += 1
        found = nonfinite(values)
        if found is not None:
            bad.append(name)
            nan, inf = nan or found[1], inf or found[2]
    return Scan(checked, tuple(bad), nan, inf, sampled)


# The safetensors dtypes of floating-point values, as torch names them (the integer ones hold no NaN).
SAFETENSORS_FLOATS = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
                      "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}


def safetensors_scan(path: str | Path, sampled: bool = False) -> Scan:
    """Every floating-point tensor of a .safetensors file, whole or sampled. Read with plain reads at each tensor's
    offset, not mapped: a mapping of a whole 30 GB file is refused where RAM and swap are smaller."""
    header = read_header(path)
    with open(path, "rb") as file:
        start = 8 + struct.unpack("<Q", file.read(8))[0]
        return scan(((name, _values(file, start, info, sampled)) for name, info in header.items()
                     if name != "__metadata__" and info.get("dtype") in SAFETENSORS_FLOATS), sampled)


def _rows(count: int, row_elements: int) -> int:
    """Rows of ``row_elements`` values that make SAMPLE_ELEMENTS (one at least), of ``count`` rows."""
    return min(count, max(1, SAMPLE_ELEMENTS // max(1, row_elements)))


def _values(file, start: int, info: dict, sampled: bool):
    """A tensor's values as a flat torch tensor: all of them, or (``sampled``, when it is large) its first rows and
    the rows at its middle."""
    import torch

    dtype = getattr(torch, SAFETENSORS_FLOATS[info["dtype"]])
    shape, (begin, end) = info["shape"], info["data_offsets"]
    width = dtype.itemsize
    elements = (end - begin) // width
    if not sampled or not shape or elements <= 2 * SAMPLE_ELEMENTS:
        spans = [(begin, end)]
    else:
        row = elements // shape[0] * width
        rows, middle = _rows(shape[0], elements // shape[0]), shape[0] // 2
        spans = [(begin, begin + rows * row), (begin + middle * row, begin + (middle + rows) * row)]
    parts = []
    for first, last in spans:
        file.seek(start + first)
        raw = bytearray(file.read(last - first))
        parts.append(torch.frombuffer(raw, dtype=dtype) if raw else torch.empty(0, dtype=dtype))
    return torch.cat(parts)


def gguf_scan(path: str | Path) -> Scan:
    """Every tensor of a GGUF file (its header already checked), sampled and dequantised."""
    import gguf

    return scan(_gguf_samples(gguf.GGUFReader(path)), sampled=True)


def _gguf_samples(reader) -> Iterator[tuple[str, object]]:
    import gguf
    import numpy as np
    import torch

    plain = (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16)
    for tensor in reader.tensors:   # each tensor's data a read-only map of the file: only what is sampled is read
        data = tensor.data
        if tensor.tensor_type in plain:   # numbers as they are: sampled as a flat run
            rows = data.reshape(-1, 1)
        else:                             # quantised blocks: whole rows of bytes, as the type packs them
            rows = data.reshape(-1, data.shape[-1]) if data.ndim > 1 else data.reshape(1, -1)
        count = _rows(rows.shape[0], int(tensor.n_elements) // rows.shape[0])
        middle = rows.shape[0] // 2
        picked = np.concatenate([rows[:count], rows[middle:middle + count]])
        values = picked if tensor.tensor_type in plain else gguf.quants.dequantize(picked, tensor.tensor_type)
        yield tensor.name, torch.from_numpy(np.asarray(values, dtype=np.float32).reshape(-1))


def transformer_file_problem(file) -> str | None:
    """What is wrong with the values of a TransformerFile (engine/models/single_file.py), sampled, or None."""
    found = gguf_scan(file.path) if file.kind == "gguf" else safetensors_scan(file.path, sampled=True)
    return found.problem(f"the transformer file {file.name}", TRANSFORMER_TODO)


def check_transformer_values(files) -> None:
    """InputError, a sentence per file, when a settings' transformer file holds NaN or infinite values: what the
    engine asks before it loads them (the app's own check reads headers only)."""
    problems = [problem for file in files if file is not None and (problem := transformer_file_problem(file))]
    if problems:
        raise InputError(problems)
