"""Where the text encoder should live on a card it does not fit beside the rest: measured on one GPU.

    python bench/text_encoder_places.py OUT.json [--repeats 2]

Builds the real-size UMT5-XXL text encoder (bench/realsize.py: Wan's shapes, random bf16 weights), then
encodes a prompt and a negative prompt of 512 tokens each (what one guided run needs) with the encoder
placed by the engine's own code (engine/run/apply_plan.py: place_encoders, encoder_visiting):

- ``device``: resident on the GPU (the fastest possible; needs 10.6 GiB of device memory all the time);
- ``offload``: moved to the GPU whole to encode, then back to RAM;
- ``streamed``: left in RAM and streamed through the GPU layer by layer (diffusers' leaf-level group offload);
- ``cpu``: run on the CPU.

For each: the encode time (first and later runs), and the device memory it takes above what was there
before, compared with the planner's prediction (engine/planning/memory.py), which calibrates
STREAMED_TEXT_ENCODER_LEAVES.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine.device.hardware import GIB  # noqa: E402
PLACES = ("device", "offload", "streamed", "cpu")


def base_plan(place: str):
    """A real plan for the 1.3B model on this GPU, with the text encoder where asked."""
    from engine.device.hardware import detect_hardware
    from engine.models.spec import KNOWN_MODELS
    from engine.planning.planner import PlanRequest, plan_memory

    plan = plan_memory(KNOWN_MODELS["Wan-AI/Wan2.1-T2V-1.3B-Diffusers"], PlanRequest(832, 480, 81),
                       detect_hardware())
    return replace(plan, text_encoder=place, device="cuda")


def encode(pipe, plan, ids, mask) -> None:
    """One guided run's encoding, as the engine does it: prompt and negative, the encoder visiting if offloaded."""
    import torch

    from engine.run.apply_plan import encoder_device, encoder_visiting

    device = encoder_device(plan)
    with encoder_visiting(pipe, "text_encoder", plan), torch.no_grad():
        for _ in range(2):
            out = pipe.text_encoder(ids.to(device), attention_mask=mask.to(device)).last_hidden_state
            out.to("cuda")
    torch.cuda.synchronize()


def measure(pipe, place: str, repeats: int, ids, mask) -> dict:
    import torch

    from engine.models.spec import KNOWN_MODELS
    from engine.planning import memory as mem
    from engine.run.apply_plan import place_encoders

    plan = base_plan(place)
    started = time.perf_counter()
    place_encoders(pipe, plan)
    torch.cuda.synchronize()
    placed_s = time.perf_counter() - started
    gc.collect()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        encode(pipe, plan, ids, mask)
        times.append(time.perf_counter() - started)
    peak = torch.cuda.max_memory_allocated()
    spec = KNOWN_MODELS["Wan-AI/Wan2.1-T2V-1.3B-Diffusers"]
    te_gb = spec.text_encoder_params * 2 / GIB
    predicted = {"device": 0.0, "offload": te_gb, "streamed": mem.streamed_text_encoder_gb(spec, 2),
                 "cpu": 0.0}[place] + (mem.text_encode_gb(spec) if place != "cpu" else 0.0)
    row = {"place": place, "place_s": placed_s, "encode_s": times, "resident_gb": before / GIB,
           "encode_peak_above_resident_gb": (peak - before) / GIB, "predicted_above_resident_gb": predicted,
           "cpu_threads": torch.get_num_threads()}
    if place == "streamed":
        leaf = spec.text_encoder_largest_params * 2 / GIB
        row["streamed_leaves_measured"] = (peak - before) / GIB / leaf
    print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}), flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--places", default=",".join(PLACES))
    args = parser.parse_args()

    import torch

    from bench import realsize

    text_encoder = realsize.text_encoder().to("cpu")
    gc.collect()
    torch.cuda.empty_cache()
    pipe = SimpleNamespace(text_encoder=text_encoder)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 256384, (1, 512), generator=generator)
    mask = torch.ones(1, 512, dtype=torch.long)
    rows = [measure(pipe, place, args.repeats, ids, mask) for place in args.places.split(",")]
    result = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "text_encoder_params": sum(p.numel() for p in text_encoder.parameters()), "rows": rows}
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
