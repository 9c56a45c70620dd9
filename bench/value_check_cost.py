"""What the engine's check of a transformer file's values costs (engine/models/finite.py): Wan2.1 I2V 14B as a
bf16 safetensors file (32.8 GB) and as a Q8_0 GGUF (17.4 GB), their tensors at the released shapes, the data
left sparse (zeros that take no disk). Seconds of the header read (the app's check) and of the sampled value
check (the engine's, as it loads), each the best of three after a first warm-up run; and the full check of a bf16
LoRA of rank 128 on every linear layer of the same model (as the engine reads a LoRA).

    python bench/value_check_cost.py docs/data/value-check-cost.json

Sparse data reads as fast as the page cache: on a disk the check reads about 20 MB in some 2,600 places, where
the load reads the whole file.
"""
from __future__ import annotations

import json
import struct
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.header_sizes import PREFIX, lora_shapes, original_shapes, transformer_shapes  # noqa: E402
from bench.realsize import TRANSFORMERS  # noqa: E402

MODEL = "wan21-i2v-14b"
Q8_BLOCK, Q8_BYTES = 32, 34   # Q8_0 keeps 32 weights in 34 bytes


def elements(shape) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def sparse_safetensors(path: Path, shapes: dict, prefix: str = PREFIX) -> Path:
    header, offset = {}, 0
    for name, shape in shapes.items():
        end = offset + 2 * elements(shape)
        header[prefix + name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, end]}
        offset += 2 * elements(shape)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * ((-len(raw)) % 8)   # safetensors pads its header to 8 bytes
    with open(path, "wb") as file:
        file.write(struct.pack("<Q", len(raw)) + raw)
        file.truncate(8 + len(raw) + offset)
    return path


def sparse_gguf(path: Path, shapes: dict) -> Path:
    """As ComfyUI-GGUF's converter makes them: the 2-D weights in Q8_0, the rest in F32 (written by the gguf
    package's writer, header only, then the file extended to its size)."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), "wan")
    for name, shape in shapes.items():
        if len(shape) == 2 and shape[-1] % Q8_BLOCK == 0:
            byte_shape = (shape[0], shape[1] // Q8_BLOCK * Q8_BYTES)
            writer.add_tensor_info(name, byte_shape, np.dtype(np.uint8), elements(byte_shape),
                                   raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor_info(name, shape, np.dtype(np.float32), 4 * elements(shape))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    file = writer.fout[0]
    file.flush()
    alignment = writer.data_alignment
    data = sum(info.nbytes + (-info.nbytes) % alignment for info in writer.tensors[0].values())
    start = file.tell() + (-file.tell()) % alignment
    file.truncate(start + data)
    file.close()
    return path


def best_of_three(work) -> float:
    work()
    times = []
    for _ in range(3):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return round(min(times), 3)


def main() -> None:
    from engine.models.finite import safetensors_scan, transformer_file_problem
    from engine.models.single_file import read_transformer_file

    config = TRANSFORMERS[MODEL]
    shapes = original_shapes(config, transformer_shapes(config))
    results = {"model": MODEL, "tensors": len(shapes)}
    with tempfile.TemporaryDirectory() as folder:
        for kind, make in (("bf16 safetensors", sparse_safetensors), ("Q8_0 gguf", sparse_gguf)):
            path = make(Path(folder) / f"{MODEL}.{'gguf' if 'gguf' in kind else 'safetensors'}", shapes)
            file = read_transformer_file(path)
            assert transformer_file_problem(file) is None
            results[kind] = {"file_gb": round(path.stat().st_size / 1e9, 1),
                             "header_seconds": best_of_three(lambda: read_transformer_file(path)),
                             "value_check_seconds": best_of_three(lambda: transformer_file_problem(file))}
            path.unlink()
        lora = sparse_safetensors(Path(folder) / "lora.safetensors", lora_shapes(shapes), prefix="")
        results["bf16 LoRA on every linear layer, rank 128, checked in full"] = {
            "file_gb": round(lora.stat().st_size / 1e9, 2),
            "value_check_seconds": best_of_three(lambda: safetensors_scan(lora))}
    text = json.dumps(results, indent=2)
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
