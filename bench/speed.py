"""Speed, phase by phase: the engine against plain diffusers on the same machine, in one process per model.

    python bench/speed.py OUT_DIR [--models 1.3b,14b,5b] [--parts cold,warm,decode,caches,attention]
    python bench/speed.py OUT_DIR --tiny         # the same code on the CPU with the self-test model (CI)
    python bench/speed.py --table OUT_DIR/speed-*.json   # the markdown tables of docs/speed.md

The 1.3B model is saved to disk first (real-size random weights, ``save_pretrained``), so both sides load
it as users do; the 14B image-to-video and 5B models are built in memory (their folders would not fit the
GPU machine's disk beside it), and only their warm runs are compared. Per model, in one process:

- cold: ``app.py generate`` against bench/plain_script.py (diffusers' documented recipe), each a fresh
  process from start to the mp4 on disk, imports included on both sides;
- warm: plain diffusers (``.to("cuda")``, the pipeline's call, ``export_to_video``) against the engine's
  default plan (request to mp4 on disk), then the engine's options (compile forced, the fast decoder), for
  the FastWan preset at 832x480x81 and the 50-step preset; latents compared with plain diffusers';
- decode: the same latents decoded in float32 (plain), bfloat16, bfloat16 with cudnn.benchmark, streamed,
  and by the fast decoder (time, peak, frames' difference from the float32 decode);
- caches: each step cache against the uncached engine run (time and difference);
- attention: every usable attention backend at the model's real shape;
- predict: the time the plan predicted for each engine run against what it took.

Nothing here asserts a time: the numbers are the output. ``--tiny`` runs every part on the CPU in seconds
(tests/test_bench_speed.py), so the code that makes the table cannot rot between GPU runs.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.speed_setup import (  # noqa: E402
    PROMPTS, Setup, build_folder, cold, difference, engine_video, free, leave_libraries_out_of_collections,
    measure_machine, part, peak_gb, peak_reset, plain_pipeline, plain_video, relative_difference, sync,
)

PARTS = ("cold", "warm", "decode", "caches", "attention")


def cases(setup: Setup, folder: Path) -> dict:
    """The two warm cases: the FastWan preset at the full size, and the standard preset's long run."""
    return {
        "fastwan": {"preset": "fastwan21-t2v-1.3b-quick", "model": str(folder), "steps": 3, "guidance": 1.0,
                    "shift": 1.0, "sigmas": (1.0, 0.757, 0.522), "scheduler": "flow_dmd"},
        "long": {"preset": "wan21-t2v-1.3b", "model": str(folder), "steps": setup.long_steps, "guidance": 5.0,
                 "shift": 3.0},
    }


# Each case's runs, in order: (side, variant, prompt index, engine settings). The plain side runs once per
# prompt it is compared on; the engine's first run of a variant pays its one-off costs (a compile), the next
# shows the steady state; "compile off" is the exact path, compared with plain diffusers bit for bit.
RUNS = {
    "fastwan": [("plain", "diffusers", 0, {}), ("plain", "diffusers", 1, {}),
                ("engine", "default", 1, {}), ("engine", "default", 0, {}),
                ("engine", "compile on", 1, {"compile": True}), ("engine", "compile on", 0, {"compile": True}),
                ("engine", "fast decoder", 0, {"decoder": "fast"}),
                ("engine", "fast decoder + compile", 0, {"decoder": "fast", "compile": True}),
                ("engine", "vae_fast + compile", 0, {"decoder": "vae_fast", "compile": True}),
                ("engine", "light VAE + compile", 0, {"decoder": "vae_light", "compile": True}),
                ("engine", "fp8 compute", 1, {"compute": "fp8"}), ("engine", "fp8 compute", 0, {"compute": "fp8"}),
                ("engine", "fp8 + fast decoder", 0, {"compute": "fp8", "decoder": "fast"})],
    "long": [("plain", "diffusers", 0, {}),
             ("engine", "default", 1, {}), ("engine", "default", 0, {}),
             ("engine", "guidance batch off", 0, {"guidance_batch": False}),
             ("engine", "compile off", 0, {"compile": False, "guidance_batch": False})],
}


def warm(setup: Setup, folder: Path, engine) -> dict:
    """Plain diffusers, then the engine, on each case; the latents of the same prompt compared."""
    results = setup.results.setdefault("warm", {})
    plain, loading = plain_pipeline(folder, setup)
    results["plain_load"] = loading
    reference = {}
    for name, case in cases(setup, folder).items():
        if name not in setup.cases:
            continue
        rows = []
        for _, variant, index, _ in (r for r in RUNS[name] if r[0] == "plain"):
            row, latents = plain_video(plain, setup, case, PROMPTS[index], setup.work / f"plain-{name}-{index}.mp4")
            rows.append({"variant": variant, "prompt": index + 1, **row})
            reference[(name, index)] = latents.cpu()
            print(f"[bench] plain {name} prompt {index + 1}: {row}", flush=True)
        results[name] = {"plain": rows, "engine": []}
        setup.save()
    plain.to("cpu")
    del plain
    free()
    for name, case in cases(setup, folder).items():
        if name not in setup.cases:
            continue
        for _, variant, index, settings in (r for r in RUNS[name] if r[0] == "engine"):
            row, latents = engine_video(engine, setup, case, PROMPTS[index], **settings)
            plain_latents = reference.get((name, index))
            row.update(variant=variant, prompt=index + 1,
                       latents_vs_plain=None if plain_latents is None else difference(latents, plain_latents),
                       relative_vs_plain=None if plain_latents is None else relative_difference(latents,
                                                                                                plain_latents))
            results[name]["engine"].append(row)
            print(f"[bench] engine {name} {variant}: {row['seconds']} s, {row['timings']}", flush=True)
            setup.save()
    return reference


# ----- the decode alone ------------------------------------------------------------------------------------
def decode(setup: Setup, folder: Path, latents) -> None:
    import torch
    from diffusers import AutoencoderKLWan
    from diffusers.video_processor import VideoProcessor

    from engine.outputs.export import to_uint8
    from engine.run.decoding import decode_latents, decode_stream, denormalize
    from engine.run.decode_stage import FAST_DECODE_CHUNK
    from engine.models.fast_decoder_file import random_fast_decoder_state, write_fast_decoder
    from engine.run.fast_decoder import load_fast_decoder

    results = setup.results.setdefault("decode", {})
    latents = latents.to(setup.device)
    vae = AutoencoderKLWan.from_pretrained(folder, subfolder="vae", torch_dtype=torch.float32).to(setup.device)
    processor = VideoProcessor(vae_scale_factor=vae.config.scale_factor_spatial)

    def timed(label, work, repeats=2):
        repeats = 1 if setup.tiny else repeats   # --tiny checks the code: its times are no one's figures
        best = None
        for _ in range(repeats):
            free()
            peak_reset()
            sync()
            started = time.perf_counter()
            frames = work()
            sync()
            seconds = time.perf_counter() - started
            best = seconds if best is None else min(best, seconds)
        results[label] = {"seconds": round(best, 3), "peak_vram_gb": peak_gb()}
        print(f"[bench] decode {label}: {results[label]}", flush=True)
        setup.save()
        return frames

    def plain_fp32():   # what WanPipeline does after the last step
        with torch.inference_mode():
            video = vae.decode(denormalize(vae, latents.to(vae.dtype)), return_dict=False)[0]
            return to_uint8(processor.postprocess_video(video, output_type="np")[0])

    reference = timed("float32 (plain)", plain_fp32)
    previous = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True
    timed("float32 + cudnn.benchmark", plain_fp32)
    vae.to(torch.bfloat16)
    torch.backends.cudnn.benchmark = previous
    half = timed("bfloat16", lambda: decode_latents(vae, processor, latents, None, setup.device))
    torch.backends.cudnn.benchmark = True
    half = timed("bfloat16 + cudnn.benchmark", lambda: decode_latents(vae, processor, latents, None, setup.device))
    streamed = timed("bfloat16 + cudnn.benchmark, streamed", lambda: _concat(decode_stream(vae, latents, setup.device)))
    torch.backends.cudnn.benchmark = previous
    results["bfloat16 vs float32 frames"] = _frame_difference(half, reference)
    results["streamed equals whole"] = bool((streamed == half).all())
    path = setup.work / "fast_decoders" / "taew2_1.safetensors"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_fast_decoder(path, random_fast_decoder_state(16, 1))
    fast = load_fast_decoder(path, setup.device, torch.float32 if setup.tiny else torch.bfloat16)
    frames = timed("fast decoder", lambda: fast.decode(latents).cpu().numpy(), repeats=3)
    results["fast decoder frames"] = list(frames.shape)
    streamed_fast = timed("fast decoder, streamed as the engine does",
                          lambda: _concat(b.cpu().numpy() for b in fast.stream(latents, FAST_DECODE_CHUNK)), repeats=3)
    results["fast decoder streamed equals whole"] = _frame_difference(streamed_fast, frames)


def _concat(batches):
    import numpy as np

    return np.concatenate(list(batches))


def _frame_difference(a, b) -> dict:
    import numpy as np

    delta = np.abs(a.astype(np.int16) - b.astype(np.int16))
    return {"max": int(delta.max()), "mean": round(float(delta.mean()), 4),
            "within_2": round(float((delta <= 2).mean()), 6)}


# ----- step caches -----------------------------------------------------------------------------------------
def caches(setup: Setup, folder: Path, engine) -> None:
    results = setup.results.setdefault("caches", {})
    case = {**cases(setup, folder)["long"], "steps": setup.cache_steps}
    base, base_latents = engine_video(engine, setup, case, PROMPTS[0], compile=False)
    results["none"] = base
    for kind in ("first_block", "taylor", "mag", "mag"):   # mag twice: calibrating, then cached
        row, latents = engine_video(engine, setup, case, PROMPTS[0], step_cache=kind)
        row["latents_vs_uncached"] = difference(latents, base_latents)
        row["speedup"] = round(base["timings"]["denoise"] / row["timings"]["denoise"], 3)
        results[kind if kind not in results else f"{kind} (calibrated)"] = row
        print(f"[bench] cache {kind}: {row['speedup']}x, diff {row['latents_vs_uncached']}", flush=True)
        setup.save()


# ----- attention backends -------------------------------------------------------------------------------------
def attention(setup: Setup) -> None:
    import torch

    from engine.run.speedups import measure_attention, usable_attention_backends

    tokens = 64 if setup.tiny else 32760
    dtype = torch.float32 if setup.tiny else torch.bfloat16
    backends = usable_attention_backends(setup.device)
    setup.results["attention"] = {
        f"{heads} heads x 128, {tokens} tokens": measure_attention(setup.device, dtype, heads, 128, tokens, backends, 3)
        for heads in (12, 40)}


# ----- 14B and 5B, built in memory ------------------------------------------------------------------------------
def in_memory(setup: Setup, key: str) -> None:
    """Step, decode and request to mp4 with the model loaded: plain diffusers against the engine's default."""
    import torch
    from PIL import Image

    from bench.validate_memory import BenchEngine
    from bench.vs_diffusers import plain_pipeline as plain_in_memory
    from engine.device.hardware import detect_hardware
    from engine.settings.presets import load_presets

    preset_name = {"14b": "wan21-i2v-14b", "5b": "wan22-ti2v-5b"}[key]
    preset = load_presets()[preset_name]
    steps = 4 if key == "14b" else 6
    image_path = setup.work / "first-frame.png"
    Image.new("RGB", (640, 608), (180, 90, 40)).save(image_path)
    image = Image.open(image_path).convert("RGB") if preset.settings.mode == "i2v" else None
    case = {"preset": preset_name, "model": preset.settings.model, "steps": steps, "guidance": preset.settings.guidance,
            "shift": preset.settings.shift}
    size = replace(setup, width=preset.settings.width, height=preset.settings.height, frames=preset.settings.frames)
    results = setup.results.setdefault(key, {"preset": preset_name, "steps": steps,
                                             "size": [size.width, size.height, size.frames]})
    pipe = plain_in_memory({"14b": "14b", "5b": "5b"}[key], preset)
    pipe.to("cuda")
    rows, reference = [], {}
    for run, prompt in enumerate(PROMPTS, start=1):
        extra = {"image": image} if image is not None else {}
        row, latents = _plain_with(pipe, size, case, prompt, setup.work / f"plain-{key}-{run}.mp4", extra)
        rows.append({"run": run, **row})
        reference[prompt] = latents.cpu()
    results["plain"] = rows
    setup.save()
    pipe.to("cpu")
    del pipe
    free()
    engine = BenchEngine(key, setup.work / "empty-model", detect_hardware(), 1.0)
    rows = []
    for run, prompt in enumerate(PROMPTS + PROMPTS[:1], start=1):
        extra = {"image": str(image_path)} if image is not None else {}
        row, latents = engine_video(engine, size, case, prompt, **extra)
        row.update(run=run, latents_vs_plain=difference(latents, reference[prompt]))
        rows.append(row)
        results["engine"] = rows
        setup.save()
    engine.unload()
    torch.cuda.empty_cache()


def _plain_with(pipe, setup, case, prompt, out, extra):
    """plain_video with the image of an image-to-video run."""
    return plain_video(_Calling(pipe, extra), setup, case, prompt, out)


class _Calling:
    """A pipeline whose call also passes ``extra`` (the first frame of an image-to-video run)."""

    def __init__(self, pipe, extra):
        self._pipe, self._extra = pipe, extra

    def __getattr__(self, name):
        return getattr(self._pipe, name)

    def __setattr__(self, name, value):
        if name.startswith("_"):
            object.__setattr__(self, name, value)
        else:
            setattr(self._pipe, name, value)

    def __call__(self, *args, **kwargs):
        return self._pipe(*args, **kwargs, **self._extra)


# ----- the whole run -------------------------------------------------------------------------------------------------
def make_engine(setup: Setup, folder: Path):
    """The engine as the app makes it, with a fast decoder and a light VAE (random weights, the light VAE at a
    quarter of the width of ``folder``'s VAE, in the published layout) in its models folder."""
    import json

    from engine.models.fast_decoder_file import random_fast_decoder_state, write_fast_decoder
    from engine.models.light_vae_file import random_light_vae, write_light_vae
    from engine.run.engine import Engine

    models = setup.work / "models"
    (models / "fast_decoders").mkdir(parents=True, exist_ok=True)
    write_fast_decoder(models / "fast_decoders" / "taew2_1.safetensors", random_fast_decoder_state(16, 1))
    config = json.loads((folder / "vae" / "config.json").read_text())
    write_light_vae(models / "fast_decoders" / "lightvaew2_1.safetensors",
                    random_light_vae(config, max(2, config["base_dim"] // 4)))
    return Engine(models, latents_hours=24.0, calibrate=True)


def run(setup: Setup, models: list[str], parts: list[str]) -> None:
    import torch

    import diffusers

    if setup.tiny:
        leave_libraries_out_of_collections()
    setup.results.update(machine=torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
                         torch=torch.__version__, diffusers=diffusers.__version__,
                         date=time.strftime("%Y-%m-%d"), size=[setup.width, setup.height, setup.frames])
    if "1.3b" in models:
        with part(setup, "folder"):
            folder = build_folder(setup)
        engine = make_engine(setup, folder)
        with part(setup, "calibrate"):
            measure_machine(setup, engine)
        if "cold" in parts:
            with part(setup, "cold"):
                cold(setup, folder)
        reference = {}
        if "warm" in parts:
            with part(setup, "warm"):
                reference = warm(setup, folder, engine)
        if "caches" in parts:
            with part(setup, "caches"):
                caches(setup, folder, engine)
        engine.unload()
        del engine
        if "decode" in parts and ("long", 0) in reference:
            with part(setup, "decode"):
                decode(setup, folder, reference[("long", 0)])
    if "attention" in parts:
        with part(setup, "attention"):
            attention(setup)
    for key in (m for m in models if m != "1.3b"):
        with part(setup, key):
            in_memory(setup, key)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", nargs="+")
    parser.add_argument("--tiny", action="store_true", help="the self-test model on the CPU (checks the code)")
    parser.add_argument("--models", default="1.3b")
    parser.add_argument("--parts", default=",".join(PARTS))
    parser.add_argument("--work", default="/tmp/wan-speed")
    parser.add_argument("--table", action="store_true")
    parser.add_argument("--cases", default="fastwan,long", help="the warm part's cases")
    args = parser.parse_args()
    if args.table:
        from bench.speed_table import tables
        print(tables([Path(p) for p in args.out]))
        return
    out = Path(args.out[0])
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    setup = replace(Setup.make(args.tiny, work, out), cases=tuple(args.cases.split(",")))
    run(setup, args.models.split(","), args.parts.split(","))
    print(f"[bench] results in {out}", flush=True)


if __name__ == "__main__":
    main()
