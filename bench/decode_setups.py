"""The exact Wan VAE decode (streamed as the engine does, bfloat16) under each convolution set-up: cuDNN's
defaults, ``cudnn.benchmark`` (its first decode at a size tunes), and channels-last 3-D weights; for Wan2.1's
VAE at 832x480x81 and Wan2.2-5B's at 1280x704x121, random weights. Time of the first decode and the best of
the next two, peak memory, and the frames' difference from the defaults'.

    python bench/decode_setups.py OUT.json
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def measure(vae, latents, layout=None) -> tuple[dict, object]:
    import numpy as np
    import torch

    from engine.run.decoding import decode_stream

    times, frames = [], None
    for _ in range(3):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        started = time.perf_counter()
        x = latents if layout is None else latents.contiguous(memory_format=layout)
        frames = np.concatenate(list(decode_stream(vae, x, "cuda")))
        torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    return {"first_s": round(times[0], 3), "seconds": round(min(times[1:]), 3),
            "peak_vram_gb": round(torch.cuda.max_memory_allocated() / 2 ** 30, 3)}, frames


def difference(a, b) -> dict:
    import numpy as np

    delta = np.abs(a.astype(np.int16) - b.astype(np.int16))
    return {"max": int(delta.max()), "mean": round(float(delta.mean()), 4)}


def main() -> None:
    import torch

    from bench import realsize

    results = {"machine": torch.cuda.get_device_name(0), "torch": torch.__version__}
    for name, wan22, shape in (("wan21 832x480x81", False, (1, 16, 21, 60, 104)),
                               ("wan22 1280x704x121", True, (1, 48, 31, 44, 80))):
        torch.manual_seed(0)
        vae = realsize.vae(wan22, torch.bfloat16)
        latents = torch.randn(*shape, device="cuda")
        rows = results[name] = {}
        torch.backends.cudnn.benchmark = False
        rows["defaults"], base = measure(vae, latents)
        torch.backends.cudnn.benchmark = True
        rows["cudnn.benchmark"], tuned = measure(vae, latents)
        rows["cudnn.benchmark"]["frames_vs_defaults"] = difference(tuned, base)
        torch.backends.cudnn.benchmark = False
        for module in vae.modules():
            if isinstance(module, torch.nn.Conv3d):
                module.to(memory_format=torch.channels_last_3d)
        rows["channels_last_3d"], last = measure(vae, latents, torch.channels_last_3d)
        rows["channels_last_3d"]["frames_vs_defaults"] = difference(last, base)
        print(name, json.dumps(rows), flush=True)
        del vae, latents
        torch.cuda.empty_cache()
    Path(sys.argv[1]).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
