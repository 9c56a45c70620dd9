"""What compiling the transformer's repeated blocks costs in a fresh process, with and without torch.compile's
caches from an earlier process: the real-size 1.3B transformer (random weights, bfloat16) at 832x480x81 (32,760
tokens), ``compile_repeated_blocks(fullgraph=True)`` as the engine calls it, then the first pass (which compiles)
and the next (compiled) timed, each setting in a process of its own.

    python bench/compile_cache.py OUT.json [--tiny]

The processes, in order, one cache folder (TORCHINDUCTOR_CACHE_DIR, Triton's beneath it) for the first three:
1. cold: an empty folder; it also saves torch's "mega-cache" artifacts (``torch.compiler.save_cache_artifacts``);
2. warm: the folder the first one filled (inductor's FX-graph and AOT-autograd caches, Triton's kernels);
3. warm + artifacts: the same, the saved artifacts loaded first (``load_cache_artifacts``);
4. not compiled: the eager pass, for the compiled pass's gain.
Nothing asserts: the seconds are the output.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNS = ("cold", "warm", "warm + artifacts", "not compiled")


def child(kind: str, folder: Path, tiny: bool) -> dict:
    """One process's measurement (the caches' variables are set by the parent before torch is imported)."""
    import torch

    device = "cpu" if tiny else "cuda"
    started = time.perf_counter()
    if kind == "warm + artifacts" and (folder / "artifacts.bin").exists():
        torch.compiler.load_cache_artifacts((folder / "artifacts.bin").read_bytes())
    loaded_s = time.perf_counter() - started
    torch.manual_seed(0)
    if tiny:
        from diffusers import WanTransformer3DModel

        model = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8, in_channels=16,
                                      out_channels=16, text_dim=32, freq_dim=16, ffn_dim=32, num_layers=2,
                                      rope_max_seq_len=32).eval().requires_grad_(False)
        latent, text = (1, 16, 3, 8, 8), (1, 8, 32)
    else:
        sys.path.insert(0, str(ROOT))
        from bench import realsize

        model = realsize.transformer("wan21-1.3b")
        latent, text = (1, 16, 21, 60, 104), (1, 512, 4096)
    dtype = next(model.parameters()).dtype
    inputs = dict(hidden_states=torch.randn(*latent, device=device, dtype=dtype),
                  timestep=torch.tensor([500], device=device),
                  encoder_hidden_states=torch.randn(*text, device=device, dtype=dtype), return_dict=False)
    if kind != "not compiled":
        model.compile_repeated_blocks(fullgraph=True)
    passes = []
    for _ in range(3):
        if device == "cuda":
            torch.cuda.synchronize()
        begun = time.perf_counter()
        with torch.inference_mode():
            model(**inputs)
        if device == "cuda":
            torch.cuda.synchronize()
        passes.append(time.perf_counter() - begun)
    row = {"first_pass_s": round(passes[0], 3), "next_pass_s": round(min(passes[1:]), 4),
           "compile_overhead_s": round(passes[0] - min(passes[1:]), 3), "artifacts_load_s": round(loaded_s, 3)}
    if kind == "cold":
        saved = torch.compiler.save_cache_artifacts()
        if saved is not None:
            (folder / "artifacts.bin").write_bytes(saved[0])
            row["artifacts_mb"] = round(len(saved[0]) / 1e6, 2)
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--child", choices=RUNS)
    parser.add_argument("--folder", type=Path)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.folder, args.tiny)), flush=True)
        return
    results = {"date": time.strftime("%Y-%m-%d")}
    folder = Path(tempfile.mkdtemp(prefix="compile-cache-"))
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(folder / "inductor"),
           "TRITON_CACHE_DIR": str(folder / "inductor" / "triton")}
    for kind in RUNS:
        started = time.perf_counter()
        done = subprocess.run([sys.executable, __file__, str(args.out), "--child", kind, "--folder", str(folder),
                               *(["--tiny"] if args.tiny else [])], capture_output=True, text=True, env=env)
        row = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else {
            "error": done.stderr[-2000:]}
        row["process_s"] = round(time.perf_counter() - started, 1)
        results[kind] = row
        print(kind, json.dumps(row), flush=True)
        args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
