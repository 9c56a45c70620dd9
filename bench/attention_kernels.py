"""Attention kernels the app does not ship, against torch's SDPA at Wan's real shapes, on one GPU.

    python bench/attention_kernels.py OUT.json
    python bench/attention_kernels.py OUT.json --tiny    # the same code on the CPU at a small shape (CI)

diffusers reaches FlashAttention 4 only through its hub kernels (downloaded at run time, never offered here);
the ``flash-attn-4`` package (CuTe DSL, Hopper and Blackwell) runs it without a download. This measures its
``flash_attn_func`` and every diffusers backend usable here (engine/run/speedups.py ``usable_attention_backends``)
against SDPA, on the 1.3B model's self-attention (12 heads of 128 at 32,760 tokens: 832x480x81) and the 14B's
(40 heads), with the largest difference from SDPA's output. A kernel that does not import or run is recorded with
its error. Nothing is asserted: the numbers are the output (docs/speed.md).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SHAPES = {"1.3b": (12, 128, 32760), "14b": (40, 128, 32760)}
TINY_SHAPES = {"tiny": (2, 64, 256)}


def timed(fn, sync, repeats: int = 10) -> float:
    for _ in range(3):
        fn()
    sync()
    started = time.perf_counter()
    for _ in range(repeats):
        fn()
    sync()
    return (time.perf_counter() - started) / repeats


def main() -> None:
    import torch
    import torch.nn.functional as F

    out, tiny = Path(sys.argv[1]), "--tiny" in sys.argv[2:]
    device = "cpu" if tiny or not torch.cuda.is_available() else "cuda"
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    results: dict = {"machine": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
                     "torch": torch.__version__, "date": time.strftime("%Y-%m-%d")}
    try:
        from flash_attn.cute import flash_attn_func as fa4
    except Exception as exc:   # noqa: BLE001 - recorded, the rest still runs
        fa4, results["flash_attn_4"] = None, f"does not import: {type(exc).__name__}: {exc}"[:400]
    from diffusers.models.attention_dispatch import dispatch_attention_fn

    from engine.run.speedups import usable_attention_backends

    backends = usable_attention_backends(device)
    results["diffusers_backends"] = list(backends)
    for name, (heads, dim, tokens) in (TINY_SHAPES if device == "cpu" else SHAPES).items():
        g = torch.Generator(device).manual_seed(0)
        q, k, v = (torch.randn(1, tokens, heads, dim, device=device, dtype=dtype, generator=g)
                   for _ in range(3))   # diffusers' layout: batch, tokens, heads, dim
        flops = 4 * heads * tokens * tokens * dim
        reference = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                   v.transpose(1, 2)).transpose(1, 2)
        row = {}

        def record(label, fn):
            try:
                output = fn()
                seconds = timed(fn, sync)
                row[label] = {"ms": round(seconds * 1e3, 3), "tflops": round(flops / seconds / 1e12, 1),
                              "max_vs_sdpa": round(float((output.float() - reference.float()).abs().max()), 5)}
            except Exception as exc:   # noqa: BLE001
                row[label] = f"{type(exc).__name__}: {exc}"[:400]
            print(f"[attention] {name} {label}: {row[label]}", flush=True)

        record("sdpa", lambda: F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                              v.transpose(1, 2)).transpose(1, 2))
        for backend in backends:
            record(f"diffusers {backend}", lambda b=backend: dispatch_attention_fn(q, k, v, backend=b))
        if fa4 is not None and device == "cuda":
            def flash4():
                output = fa4(q, k, v)
                return output[0] if isinstance(output, tuple) else output
            record("flash_attn_4", flash4)
        results[name] = row
        out.write_text(json.dumps(results, indent=2))
    out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
