"""Guidance in one batch (engine/run/guidance_batch.py) against the two calls it replaces, uncompiled: whether the
conditional and unconditional outputs are bit for bit those of two calls, and the time of a step either way, for the
Wan2.1 1.3B transformer's width (12 heads of 128, FFN 8960) at 832x480x81 (32,760 tokens) in bfloat16, random
weights, on a few layers (every layer is the same work: the result does not depend on how many).

    python bench/guidance_batch.py OUT.json [--layers 4]
    python bench/guidance_batch.py OUT.json --tiny      # the same code on the CPU with a tiny transformer

The plan batches only where the transformer is compiled or streamed (engine/planning/planner.py), so the
uncompiled on-device path keeps plain diffusers' latents; this measures whether it could batch there too. Nothing
asserts.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

LATENTS = (1, 16, 21, 60, 104)          # 832x480x81
TINY_LATENTS = (1, 16, 3, 8, 12)
TEXT = (1, 512, 4096)


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def _transformer(tiny: bool, layers: int):
    import torch

    if tiny:
        from diffusers import WanTransformer3DModel

        torch.manual_seed(0)
        return WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12,
                                     in_channels=16, out_channels=16, text_dim=4096, freq_dim=256, ffn_dim=32,
                                     num_layers=layers, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
                                     rope_max_seq_len=32).to(torch.bfloat16).eval().requires_grad_(False)
    from bench import realsize

    realsize.TRANSFORMERS["probe"] = dict(realsize.TRANSFORMERS["wan21-1.3b"], num_layers=layers)
    return realsize.transformer("probe", torch.bfloat16)


def run(out: Path, tiny: bool, layers: int) -> dict:
    import torch

    from engine.run.guidance_batch import batched_guidance

    device = "cpu" if tiny else "cuda"
    model = _transformer(tiny, layers)
    if tiny:   # past the libraries' objects at the exit
        from bench.speed_setup import leave_libraries_out_of_collections

        leave_libraries_out_of_collections(engine=False)
    torch.manual_seed(1)
    latents = torch.randn(*(TINY_LATENTS if tiny else LATENTS), device=device, dtype=torch.bfloat16)
    text, negative = (torch.randn(*TEXT, device=device, dtype=torch.bfloat16) for _ in range(2))
    timestep = torch.tensor([999.0], device=device)

    def two_calls():
        return (model(latents, timestep, text, return_dict=False)[0],
                model(latents, timestep, negative, return_dict=False)[0])

    def one_batch():
        with batched_guidance([model], negative):
            return two_calls()

    results = {"machine": torch.cuda.get_device_name(0) if device == "cuda" else "cpu", "torch": torch.__version__,
               "date": time.strftime("%Y-%m-%d"), "layers": layers, "latents": list(latents.shape),
               "dtype": "bfloat16", "compiled": False}
    with torch.inference_mode():
        for name, step in (("two_calls", two_calls), ("one_batch", one_batch)):
            times = []
            for number in range(2 if tiny else 4):   # the first a warm-up; --tiny checks the code
                _sync(device)
                started = time.perf_counter()
                outputs = step()
                _sync(device)
                if number:
                    times.append(time.perf_counter() - started)
            results[name] = {"step_s": round(min(times), 4), "all_s": [round(t, 4) for t in times]}
            results[name + "_outputs"] = outputs
    plain, batched = results.pop("two_calls_outputs"), results.pop("one_batch_outputs")
    for half, a, b in (("conditional", plain[0], batched[0]), ("unconditional", plain[1], batched[1])):
        delta = (a.float() - b.float()).abs()
        results[half] = {"equal": bool(torch.equal(a, b)), "max_abs": float(delta.max()),
                         "share_differing": round(float((delta > 0).float().mean()), 7),
                         "relative": float(delta.norm() / a.float().norm())}
    results["batch_vs_two_calls"] = round(results["one_batch"]["step_s"] / results["two_calls"]["step_s"], 4)
    out.write_text(json.dumps(results, indent=2))
    print(json.dumps(results), flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--tiny", action="store_true")
    args = parser.parse_args()
    run(args.out, args.tiny, 2 if args.tiny and args.layers == 4 else args.layers)


if __name__ == "__main__":
    main()
