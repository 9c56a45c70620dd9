"""Measure what engine/planning/memory.py's constants stand for, on a real GPU with real-size random weights.

    python bench/calibrate_memory.py OUT.json

Prints and saves: transformer activation peaks per token count, VAE decode peaks
(untiled and tiled) per size, encoder activation peaks, and the step time and
device footprint of each transformer strategy. Runs in about 4 minutes on an H200.
"""
from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from bench import realsize  # noqa: E402
from engine.device.hardware import GIB  # noqa: E402

results: dict = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}


def gb(x):
    return round(x / GIB, 3)


def measure(fn, repeat=1):
    """(peak extra GiB above what was allocated before, seconds of the last call)."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    seconds = 0.0
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn()
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        del out
    return gb(torch.cuda.max_memory_allocated() - base), round(seconds, 3)


def transformer_inputs(name, width, height, frames):
    cfg = realsize.TRANSFORMERS[name]
    spatial = 16 if name == "wan22-5b" else 8
    shape = realsize.latent_shape(width, height, frames, cfg["in_channels"], spatial)
    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    tokens = shape[2] * (shape[3] // 2) * (shape[4] // 2)
    t = torch.full((1, tokens), 500.0, device="cuda") if name == "wan22-5b" else torch.tensor([500.0], device="cuda")
    kwargs = dict(hidden_states=x, timestep=t, return_dict=False,
                  encoder_hidden_states=torch.randn(1, 512, 4096, device="cuda", dtype=torch.bfloat16))
    if "i2v" in name:
        kwargs["encoder_hidden_states_image"] = torch.randn(1, 257, 1280, device="cuda", dtype=torch.bfloat16)
    return kwargs, tokens


def log(key, value):
    print(key, value, flush=True)
    results[key] = value


def calibrate_transformers():
    sizes = {"wan21-1.3b": [(832, 480, 81), (480, 480, 25)], "wan21-i2v-14b": [(480, 480, 33), (832, 480, 81)],
             "wan22-5b": [(1280, 704, 121), (1280, 704, 41)]}
    for name, cases in sizes.items():
        model = realsize.transformer(name)
        weights = gb(torch.cuda.memory_allocated())
        log(f"transformer/{name}/weights_gb", weights)
        with torch.inference_mode():
            for width, height, frames in cases:
                kwargs, tokens = transformer_inputs(name, width, height, frames)
                act, sec = measure(lambda: model(**kwargs), repeat=2)
                log(f"transformer/{name}/{width}x{height}x{frames}", {"tokens": tokens, "act_gb": act, "forward_s": sec})
            kwargs, tokens = transformer_inputs(name, *cases[0])
            if name != "wan22-5b":
                strategies(name, model, kwargs)
        del model, kwargs
        torch.cuda.empty_cache()


def strategies(name, model, kwargs):
    """Device footprint and forward time of group / leaf offload and fp8 storage."""
    model.to("cpu")
    torch.cuda.empty_cache()
    for kind in ("block_level", "leaf_level"):
        model.enable_group_offload(onload_device="cuda", offload_device="cpu", offload_type=kind,
                                   num_blocks_per_group=1 if kind == "block_level" else None, use_stream=True)
        model(**kwargs)  # first call pins and warms
        peak, sec = measure(lambda: model(**kwargs))
        log(f"strategy/{name}/{kind}", {"peak_gb": peak, "resident_gb": gb(torch.cuda.memory_allocated()),
                                         "forward_s": sec})
        for module in model.modules():
            registry = getattr(module, "_diffusers_hook", None)
            if registry is not None:
                for hook_name in list(registry.hooks):
                    registry.remove_hook(hook_name, recurse=False)
        model.to("cpu")
        torch.cuda.empty_cache()
    model.to("cuda")
    model.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=torch.bfloat16)
    torch.cuda.empty_cache()
    resident = gb(torch.cuda.memory_allocated())
    model(**kwargs)
    peak, sec = measure(lambda: model(**kwargs))
    log(f"strategy/{name}/fp8", {"weights_gb": resident, "peak_gb": peak, "forward_s": sec})


def calibrate_vae():
    for wan22, cases in ((False, [(832, 480, 81), (480, 480, 33), (480, 480, 25), (832, 480, 33)]),
                         (True, [(1280, 704, 121), (1280, 704, 41)])):
        model = realsize.vae(wan22)
        tag = "vae22" if wan22 else "vae21"
        z, spatial = (48, 16) if wan22 else (16, 8)
        for width, height, frames in cases:
            latents = torch.randn(realsize.latent_shape(width, height, frames, z, spatial), device="cuda")
            for tile in (None, 256, 384, 512):
                if tile is None:
                    model.disable_tiling()
                else:
                    stride = tile * 3 // 4
                    model.enable_tiling(tile_sample_min_height=tile, tile_sample_min_width=tile,
                                        tile_sample_stride_height=stride, tile_sample_stride_width=stride)
                with torch.inference_mode():
                    peak, sec = measure(lambda: model.decode(latents, return_dict=False)[0])
                log(f"{tag}/{width}x{height}x{frames}/tile{tile}", {"peak_gb": peak, "decode_s": sec})
        del model
        torch.cuda.empty_cache()


def calibrate_encoders():
    te = realsize.text_encoder()
    log("text_encoder/weights_gb", gb(torch.cuda.memory_allocated()))
    ids = torch.randint(0, 1000, (1, 512), device="cuda")
    mask = torch.ones_like(ids)
    with torch.inference_mode():
        peak, sec = measure(lambda: (te(ids, mask).last_hidden_state, te(ids, mask).last_hidden_state), repeat=2)
    log("text_encoder/encode", {"act_gb": peak, "encode_s": sec})
    del te
    torch.cuda.empty_cache()
    ie, _ = realsize.image_encoder()
    pixels = torch.randn(1, 3, 224, 224, device="cuda", dtype=torch.bfloat16)
    with torch.inference_mode():
        peak, sec = measure(lambda: ie(pixel_values=pixels, output_hidden_states=True).hidden_states[-2], repeat=2)
    log("image_encoder/encode", {"act_gb": peak, "encode_s": sec})
    del ie
    torch.cuda.empty_cache()


if __name__ == "__main__":
    started = time.time()
    for part in (calibrate_encoders, calibrate_vae, calibrate_transformers):
        try:
            part()
        except Exception as exc:  # keep what was measured so far
            log(f"error/{part.__name__}", repr(exc))
        torch.cuda.empty_cache()
    results["seconds"] = round(time.time() - started, 1)
    with open(sys.argv[1], "w") as f:
        json.dump(results, f, indent=2)
