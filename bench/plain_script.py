"""What a person writes without this app: diffusers' documented Wan recipe, start to mp4 (the cold-start baseline).

    python bench/plain_script.py FOLDER OUT.mp4 [--steps 10] [--width 832] [--height 480] [--frames 81]

The VAE in float32 and the rest in bfloat16, everything moved to the GPU, one call, then diffusers'
``export_to_video``. bench/speed.py times this whole process against ``app.py generate`` doing the same.
"""
from __future__ import annotations

import argparse
import json
import time

STARTED = time.perf_counter()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("folder")
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--width", type=int, default=832)
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--frames", type=int, default=81)
    parser.add_argument("--guidance", type=float, default=5.0)
    args = parser.parse_args()

    import torch
    from diffusers import AutoencoderKLWan, WanPipeline
    from diffusers.utils import export_to_video

    imported = time.perf_counter()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    vae = AutoencoderKLWan.from_pretrained(args.folder, subfolder="vae", torch_dtype=torch.float32)
    pipe = WanPipeline.from_pretrained(args.folder, vae=vae, torch_dtype=dtype)
    pipe.to(device)
    loaded = time.perf_counter()
    frames = pipe(prompt="a red fox running through fresh snow, cinematic", negative_prompt="blurry, low quality",
                  height=args.height, width=args.width, num_frames=args.frames, num_inference_steps=args.steps,
                  guidance_scale=args.guidance, generator=torch.Generator("cpu").manual_seed(1)).frames[0]
    generated = time.perf_counter()
    export_to_video(frames, args.out, fps=16)
    print(json.dumps({"imports_s": imported - STARTED, "load_s": loaded - imported, "call_s": generated - loaded,
                      "export_s": time.perf_counter() - generated}))


if __name__ == "__main__":
    main()
