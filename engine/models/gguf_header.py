"""A GGUF file's header walked with ``struct`` before ``gguf.GGUFReader`` sees it.

The reader allocates for everything a header declares (a numpy view per key, per array item, per tensor) before
anything can be checked, so a damaged or hostile file that declares a billion tensors or a string of 2^60 bytes
costs it minutes and gigabytes. Here the counts and lengths are read first and refused above limits taken from
the largest published Wan files (engine/models/weights.py), each before it is acted on; nothing is allocated for
what the header declares. The layout (the GGUF specification, versions 2 and 3): "GGUF", the version (uint32),
the tensor and key counts (uint64), each key (a string, a value type, a value), then each tensor's name,
dimension count, dimensions, type and offset; strings are a uint64 length and the bytes.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from engine.models.weights import MAX_HEADER_BYTES, MAX_TENSORS, megabytes

GGUF_MAGIC = b"GGUF"
GGUF_VERSIONS = (2, 3)   # what gguf.GGUFReader reads
# Value types of the specification: the fixed-size ones by their struct code; 8 is a string, 9 an array.
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
STRING, ARRAY = 8, 9
# ComfyUI's converter may add a key per tensor it reshapes (comfy.gguf.orig_shape.<name>), beside a few general.*
# ones: a key per tensor allowed is the most such a file needs.
MAX_KEYS = MAX_TENSORS
# A Wan file's strings are tensor names and short notes (under 100 bytes); the longest strings of any GGUF file
# in use are language models' chat templates, some 10 kB.
MAX_STRING_BYTES = 65_536
# The longest array a GGUF file of this family could hold is a text encoder's vocabulary (UMT5's 256,384
# tokens); a Wan transformer's are ComfyUI's shapes, of 5 numbers at most. Twice UMT5's.
MAX_ARRAY_ITEMS = 2 * 256_384
# A Wan weight has at most 5 dimensions (the patch embedding's 3-D convolution; ComfyUI's converter stores it
# reshaped to ggml's 4, the gguf package's writer as it is): a generous twice that less two.
MAX_DIMS = 8
# Arrays of arrays are allowed by the format; none is this deep.
MAX_NESTING = 3


# How each refusal of a declared count ends. The counts themselves are not quoted: in a damaged file they are
# whatever its bytes happen to be.
NOT_WAN = "it is damaged or not a Wan transformer file"


class GGUFHeaderError(ValueError):
    """A GGUF header that is not one, is cut short, or declares more than a Wan file has; the message is a clause
    about the file ("is not a GGUF file ...")."""


@dataclass(frozen=True)
class GGUFCounts:
    version: int
    tensors: int
    keys: int
    header_bytes: int   # where the tensor descriptions end


class _Walker:
    """Reads the header in order, never past its own limits or the end of the file."""

    def __init__(self, file: BinaryIO, size: int):
        self.file, self.size, self.order, self.at = file, size, "<", 0

    def _room(self, count: int) -> None:
        end = self.at + count
        if end > self.size:
            raise GGUFHeaderError("is cut short (its header runs past the end of the file): download it again")
        if end > MAX_HEADER_BYTES:
            raise GGUFHeaderError(f"has a header of more than {megabytes(MAX_HEADER_BYTES)}, more than any Wan "
                                  f"transformer file needs: {NOT_WAN}")

    def read(self, count: int) -> bytes:
        self._room(count)
        self.at += count
        return self.file.read(count)

    def skip(self, count: int) -> None:
        self._room(count)
        self.at += count
        self.file.seek(count, 1)

    def number(self, code: str) -> int:
        return struct.unpack(self.order + code, self.read(struct.calcsize(code)))[0]

    def string(self, what: str) -> None:
        length = self.number("Q")
        if length > MAX_STRING_BYTES:
            raise GGUFHeaderError(f"declares a {what} longer than the {MAX_STRING_BYTES:,} bytes any GGUF file needs: "
                                  f"{NOT_WAN}")
        self.skip(length)

    def value(self, kind: int, depth: int = 0) -> None:
        if kind in SCALARS:
            self.skip(struct.calcsize(SCALARS[kind]))
        elif kind == STRING:
            self.string("string")
        elif kind == ARRAY and depth < MAX_NESTING:
            self.array(depth)
        else:
            raise GGUFHeaderError("holds a value of a type GGUF does not have: it is damaged; download it again")

    def array(self, depth: int) -> None:
        kind, count = self.number("I"), self.number("Q")
        if count > MAX_ARRAY_ITEMS:
            raise GGUFHeaderError(f"declares a list of more than the {MAX_ARRAY_ITEMS:,} values any GGUF file of "
                                  f"these models holds: {NOT_WAN}")
        if kind in SCALARS:
            self.skip(count * struct.calcsize(SCALARS[kind]))
            return
        for _ in range(count):
            self.value(kind, depth + 1)

    def tensor(self) -> None:
        self.string("tensor name")
        dims = self.number("I")
        if dims > MAX_DIMS:
            raise GGUFHeaderError(f"declares a tensor of more than GGUF's {MAX_DIMS} dimensions: it is damaged; "
                                  "download it again")
        self.skip(8 * dims + 4 + 8)   # the dimensions, the type, the offset


def check_gguf_header(path: str | Path) -> GGUFCounts:
    """The counts of a GGUF file's header, every declared count and length checked against the limits before it is
    used; GGUFHeaderError saying what is wrong otherwise. Reads the header only (about 100 kB for a 14B model)."""
    path = Path(path)
    with open(path, "rb") as file:
        walker = _Walker(file, path.stat().st_size)
        if walker.size < 24 or file.read(4) != GGUF_MAGIC:
            raise GGUFHeaderError("is not a GGUF file (it does not begin as one does): give a .gguf transformer "
                                  "file, or download it again")
        walker.at = 4
        version = walker.number("I")
        if version & 0xFFFF == 0:   # written on a machine of the other byte order, as gguf.GGUFReader reads it
            walker.order, version = ">", struct.unpack(">I", struct.pack("<I", version))[0]
        if version not in GGUF_VERSIONS:
            raise GGUFHeaderError(f"is a GGUF file of a version this app cannot read (it reads versions "
                                  f"{' and '.join(map(str, GGUF_VERSIONS))}): download a current file")
        tensors, keys = walker.number("Q"), walker.number("Q")
        _check_counts(tensors, keys)
        for _ in range(keys):
            walker.string("key")
            walker.value(walker.number("I"))
        for _ in range(tensors):
            walker.tensor()
        return GGUFCounts(version, tensors, keys, walker.at)


def _check_counts(tensors: int, keys: int) -> None:
    if tensors > MAX_TENSORS:
        raise GGUFHeaderError(f"declares more than the {MAX_TENSORS:,} tensors any Wan transformer file has: "
                              f"{NOT_WAN}")
    if keys > MAX_KEYS:
        raise GGUFHeaderError(f"declares more than the {MAX_KEYS:,} metadata keys any Wan transformer file has: "
                              f"{NOT_WAN}")
