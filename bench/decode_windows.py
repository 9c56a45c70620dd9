"""The exact Wan VAE decode with several latent frames a call of the decoder (engine/run/decoding.py
``decode_stream(window=...)``), against one a call as today: time, peak memory and the frames' difference, for
Wan2.1's VAE at 832x480x81 and Wan2.2-5B's at 1280x704x121 (random weights, bfloat16, cuDNN's defaults), and with
channels-last 3-D convolutions (the approximate set-up) at the fastest window.

    python bench/decode_windows.py OUT.json [--windows 1,2,4,7,10,20]
    python bench/decode_windows.py OUT.json --tiny      # the same code on the CPU with the self-test VAE

The peak above the latents, per window, is what the planner's ``vae_window_gb`` is made from. Nothing asserts.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SIZES = (("wan21 832x480x81", False, (1, 16, 21, 60, 104)), ("wan22 1280x704x121", True, (1, 48, 31, 44, 80)))
TINY_SIZES = (("wan21 tiny", False, (1, 16, 5, 8, 12)),)


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def timed(decode, device: str, repeats: int = 2) -> tuple[dict, object]:
    """(the best of ``repeats`` runs of ``decode()`` after one warm-up and the peak allocated above what was there,
    the last run's result)."""
    import torch

    times, result = [], None
    base = torch.cuda.memory_allocated() if device == "cuda" else 0
    for number in range(repeats + 1):
        _sync(device)
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        started = time.perf_counter()
        result = decode()
        _sync(device)
        if number:
            times.append(time.perf_counter() - started)
    peak = (torch.cuda.max_memory_allocated() - base) / 2 ** 30 if device == "cuda" else None
    return {"seconds": round(min(times), 3), "all_s": [round(t, 3) for t in times],
            "peak_above_gb": None if peak is None else round(peak, 3)}, result


def measure(vae, latents, window: int, device: str, repeats: int = 2) -> tuple[dict, object]:
    """The VAE's decode in ``window`` latent frames a call: timed, and its frames."""
    import numpy as np

    from engine.run.decoding import decode_stream

    return timed(lambda: np.concatenate(list(decode_stream(vae, latents, device, window=window))), device, repeats)


def difference(a, b) -> dict:
    import numpy as np

    delta = np.abs(a.astype(np.int16) - b.astype(np.int16))
    return {"max": int(delta.max()), "share_differing": round(float((delta > 0).mean()), 7)}


def run(out: Path, windows: list[int], tiny: bool) -> dict:
    import torch

    device = "cpu" if tiny else "cuda"
    repeats = 1 if tiny else 2   # after the warm-up run: --tiny checks the code, its times are no one's figures
    results = {"machine": torch.cuda.get_device_name(0) if device == "cuda" else "cpu", "torch": torch.__version__,
               "date": time.strftime("%Y-%m-%d")}
    torch.backends.cudnn.benchmark = False
    for name, wan22, shape in (TINY_SIZES if tiny else SIZES):
        torch.manual_seed(0)
        if tiny:
            from bench.speed_setup import leave_libraries_out_of_collections
            from engine.models.selftest import _vae

            vae = _vae()
            leave_libraries_out_of_collections(engine=False)   # past the libraries' objects at the exit
        else:
            from bench import realsize

            vae = realsize.vae(wan22, torch.bfloat16)
        latents = torch.randn(*shape, device=device)
        rows = results[name] = {}
        base = None
        for window in windows:
            try:
                rows[f"window {window}"], frames = measure(vae, latents, window, device, repeats)
            except torch.OutOfMemoryError as exc:   # noqa: PERF203 (a window too large is a result)
                rows[f"window {window}"] = {"error": str(exc)[:200]}
                torch.cuda.empty_cache()
                continue
            if base is None:
                base = frames
            rows[f"window {window}"]["frames_vs_window_1"] = difference(frames, base)
            print(name, window, json.dumps(rows[f"window {window}"]), flush=True)
            out.write_text(json.dumps(results, indent=2))
        fastest = min((int(k.split()[1]) for k, v in rows.items() if "seconds" in v),
                      key=lambda w: rows[f"window {w}"]["seconds"])
        for module in vae.modules():
            if isinstance(module, torch.nn.Conv3d):
                module.to(memory_format=torch.channels_last_3d)
        for window in sorted({1, fastest}):
            row, frames = measure(vae, latents.contiguous(memory_format=torch.channels_last_3d), window, device,
                                  repeats)
            row["frames_vs_window_1"] = difference(frames, base)
            rows[f"channels_last_3d, window {window}"] = row
            print(name, "channels_last", window, json.dumps(row), flush=True)
        del vae, latents
        if device == "cuda":
            torch.cuda.empty_cache()
        out.write_text(json.dumps(results, indent=2))
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--windows", default="1,2,4,7,10,20")
    parser.add_argument("--tiny", action="store_true")
    args = parser.parse_args()
    run(args.out, [int(w) for w in args.windows.split(",")], args.tiny)


if __name__ == "__main__":
    main()
