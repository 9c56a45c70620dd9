"""Weight-file headers above what any Wan file needs are refused in milliseconds, before anything is parsed.

The limits come from the measured headers of the released architectures (docs/data/header-sizes.json, by
bench/header_sizes.py). The files here are written by hand, as a damaged or hostile one would be: a LoRA whose
96 MB header lists 871,560 empty tensors (the probe's: 13 s and 730 MB to parse, 63 s and 2 GB in the engine),
headers with more tensors than any Wan file, GGUF headers that declare a billion tensors or lists of a million
values, and files of another format under a weight file's name.
"""
from __future__ import annotations

import json
import struct
import time
from pathlib import Path

import pytest

from engine.models.gguf_header import MAX_ARRAY_ITEMS, MAX_KEYS, MAX_STRING_BYTES, check_gguf_header
from engine.models.loras import lora_file_problem
from engine.models.single_file import read_transformer_file
from engine.models.weights import MAX_HEADER_BYTES, MAX_TENSORS, TENSOR_TABLE_BYTES, WeightFileError, read_header
from engine.settings.values import InputError, check_settings
from tests.conftest import ROOT

# What the refusals may take: the header's first bytes read, a count of the raw bytes, no parsing.
FAST_SECONDS = 0.5
EMPTY = '{{"dtype":"F32","shape":[0],"data_offsets":[0,0]}}'


def write_empty_tensors(path: Path, count: int, name: str = "diffusion_model.blocks.{}.self_attn.q.lora_down.weight"):
    """A safetensors file whose header lists ``count`` empty tensors, written in one go (no library: it would refuse
    or take long): valid, each entry consistent with the file's size."""
    entries = ",".join(f'"{name.format(number)}":{EMPTY.format()}' for number in range(count))
    raw = ("{" + entries + "}").encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw)
    return path


@pytest.fixture(scope="module")
def huge_lora(tmp_path_factory) -> Path:
    return write_empty_tensors(tmp_path_factory.mktemp("huge") / "huge.safetensors", 871_560)


def timed(work):
    started = time.perf_counter()
    result = work()
    return result, time.perf_counter() - started


def test_the_limits_are_about_twice_the_largest_measured_wan_files():
    measured = json.loads((ROOT / "docs" / "data" / "header-sizes.json").read_text())["largest"]
    assert 2 * measured["tensors"] <= MAX_TENSORS <= 2.5 * measured["tensors"]
    assert 2 * measured["header_bytes"] <= TENSOR_TABLE_BYTES <= 2.5 * measured["header_bytes"]
    assert MAX_HEADER_BYTES < 5_000_000   # beside the metadata allowance, far below the 100 MB allowed before


def test_a_98_mb_lora_header_of_871560_tensors_is_refused_by_the_check_in_milliseconds(huge_lora, presets):
    size = huge_lora.stat().st_size
    assert 95_000_000 < size < 100_000_000
    problem, seconds = timed(lambda: lora_file_problem(str(huge_lora)))
    assert seconds < FAST_SECONDS, seconds
    assert problem == (f"LoRA file 'huge.safetensors' cannot be read: its header is {(size - 8) / 1e6:.1f} MB, more "
                       "than the 2.6 MB that any Wan model's or LoRA's file needs: the file is damaged or is not a Wan "
                       "weight file; download it again")
    settings = presets["selftest-t2v"].settings.changed(loras=((str(huge_lora), 1.0),))
    started = time.perf_counter()
    with pytest.raises(InputError) as refused:   # what the page's plan panel and every job's check ask
        check_settings(settings)
    assert time.perf_counter() - started < FAST_SECONDS
    assert f"its header is {(size - 8) / 1e6:.1f} MB" in str(refused.value)


def test_a_header_within_the_size_but_with_more_tensors_than_any_wan_file_is_refused_unparsed(tmp_path):
    many = write_empty_tensors(tmp_path / "many.safetensors", MAX_TENSORS + 1, name="t{}")
    assert many.stat().st_size < MAX_HEADER_BYTES
    with pytest.raises(WeightFileError) as refused:
        read_header(many)
    assert str(refused.value) == (f"its header lists {MAX_TENSORS + 1:,} tensors, more than the {MAX_TENSORS:,} that "
                                  "any Wan model's or LoRA's file holds: the file is damaged or is not a Wan weight file")
    enough = write_empty_tensors(tmp_path / "enough.safetensors", MAX_TENSORS, name="t{}")
    assert len(read_header(enough)) == MAX_TENSORS


def test_a_transformer_file_of_another_format_is_named_as_given_and_never_quoted(tmp_path):
    blob = tmp_path / "blobs" / "5f3c9a"
    blob.parent.mkdir()
    blob.write_bytes(b"PK\x03\x04" + bytes(range(256)) * 64)   # a zip renamed .safetensors
    link = tmp_path / "wan-t2v-14b.safetensors"
    link.symlink_to(blob)
    with pytest.raises(InputError) as refused:
        read_transformer_file(link)
    message = str(refused.value)
    assert message == ("The transformer file wan-t2v-14b.safetensors is damaged: it is not a safetensors file (it does "
                       "not begin with a safetensors header); download it again.")
    claimed = struct.unpack("<Q", blob.read_bytes()[:8])[0]
    assert f"{claimed:,}" not in message and "5f3c9a" not in message and str(tmp_path) not in message


# ----- GGUF ---------------------------------------------------------------------------------------------------
def gguf_bytes(tensors: int = 0, keys: list[bytes] = (), version: int = 3) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", version, tensors, len(keys)) + b"".join(keys)


def key(name: str, kind: int, value: bytes) -> bytes:
    raw = name.encode()
    return struct.pack("<Q", len(raw)) + raw + struct.pack("<I", kind) + value


def refusal(tmp_path: Path, data: bytes, name: str = "wan-Q8_0.gguf") -> str:
    path = tmp_path / name
    path.write_bytes(data)
    started = time.perf_counter()
    with pytest.raises(InputError) as refused:
        read_transformer_file(path)
    assert time.perf_counter() - started < FAST_SECONDS
    return str(refused.value)


def test_gguf_headers_that_declare_more_than_any_wan_file_are_refused_before_the_reader_allocates(tmp_path):
    padding = b"\0" * 64
    huge_string = struct.pack("<Q", 2 ** 60)
    cases = {
        "declares more than the 5,000 tensors": gguf_bytes(tensors=10 ** 9) + padding,
        f"declares more than the {MAX_KEYS:,} metadata keys": gguf_bytes()[:16] + struct.pack("<Q", 2 ** 40) + padding,
        f"declares a key longer than the {MAX_STRING_BYTES:,} bytes": gguf_bytes(keys=[huge_string]) + padding,
        f"declares a string longer than the {MAX_STRING_BYTES:,} bytes": gguf_bytes(
            keys=[key("general.name", 8, huge_string)]) + padding,
        # A real list of a million values, all there: gguf.GGUFReader would make a numpy view of each.
        f"declares a list of more than the {MAX_ARRAY_ITEMS:,} values": gguf_bytes(
            keys=[key("general.notes", 9, struct.pack("<IQ", 0, 10 ** 6) + bytes(10 ** 6))]),
        "is cut short (its header runs past the end of the file)": gguf_bytes(tensors=2, keys=[
            key("general.architecture", 8, struct.pack("<Q", 3) + b"wan")]) + b"\x05\0\0\0",
        "is not a GGUF file (it does not begin as one does)": bytes(range(256)),
        "is a GGUF file of a version this app cannot read": gguf_bytes(version=99) + padding,
    }
    for words, data in cases.items():
        message = refusal(tmp_path, data)
        assert message.startswith("The transformer file wan-Q8_0.gguf ") and words in message, (words, message)
        assert f"{2 ** 60:,}" not in message and f"{10 ** 9:,}" not in message


def test_a_real_gguf_header_passes_the_walk_with_its_counts(tmp_path):
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(tmp_path / "small.gguf"), "wan")
    writer.add_array("comfy.gguf.orig_shape.patch_embedding.weight", [24, 16, 1, 2, 2])
    for number in range(3):
        writer.add_tensor(f"blocks.{number}.ffn.0.weight", np.zeros((4, 32), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    counts = check_gguf_header(tmp_path / "small.gguf")
    assert (counts.version, counts.tensors, counts.keys) == (3, 3, 2)   # general.architecture and the shape list
    assert counts.header_bytes < (tmp_path / "small.gguf").stat().st_size
