"""The engine against plain diffusers, side by side on one GPU, in one process.

    python bench/vs_diffusers.py OUT.json [--cases 1.3b@full,1.3b@12,14b@24] [--steps 10]
    python bench/vs_diffusers.py --table OUT.json [OUT2.json ...]     # the markdown table of docs/speed.md

A case is a model and a card: ``full`` is the whole GPU, a number caps it at that many GiB with
torch.cuda.set_per_process_memory_fraction (an emulated smaller card). In each case:

- plain diffusers tries the recipes its documentation gives, in order, until one completes:
  ``pipe.to("cuda")``; ``enable_model_cpu_offload()`` with VAE tiling; ``enable_sequential_cpu_offload()``
  with VAE tiling. A recipe that runs out of memory is recorded as such.
- the engine runs the same request through its own code path (planning, placement, offload hooks,
  encoders, denoising with the default live preview, VAE decode), choosing its plan by itself.

Both get the same real-size random-weight components (bench/realsize.py), built on the GPU and moved
to RAM before the clock starts, the same scheduler, size, steps, guidance and seed. Each side runs
twice: the first run includes putting the model in place (``.to``/offload set-up, or the engine's
transfer), the second is warm and uses a new prompt (so neither side reuses a prompt encoding).
Recorded per run: wall time from the components in RAM to decoded frames, the time to the first
transformer call (text encoding and set-up), the denoising, the decode, the mean step and the peak
device memory. Writing the video file is left out on both sides (no ffmpeg on the GPU machine).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine.device.hardware import GIB  # noqa: E402

PROMPTS = ("a red fox running through fresh snow, cinematic", "a paper boat drifting down a rainy street")
CASE_MODELS = {"1.3b": ("wan21-t2v-1.3b", "1.3b"), "14b": ("wan21-i2v-14b", "14b")}
RECIPES = ("to_cuda", "model_cpu_offload", "sequential_cpu_offload")


def parse_case(case: str) -> tuple[str, float | None]:
    model, _, card = case.partition("@")
    return model, None if card in ("", "full") else float(card)


# ----- plain diffusers -------------------------------------------------------------------------------
def plain_pipeline(key: str, preset):
    import torch
    from diffusers import UniPCMultistepScheduler, WanImageToVideoPipeline, WanPipeline

    from bench import realsize
    from bench.validate_memory import build_parts

    parts = build_parts(key, "cpu")
    gc.collect()
    torch.cuda.empty_cache()
    scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True,
                                        flow_shift=preset.settings.shift)
    cls = WanImageToVideoPipeline if "image_encoder" in parts else WanPipeline
    extra = {"expand_timesteps": True} if key == "5b" else {}   # as Wan2.2-TI2V-5B's model_index.json says
    pipe = cls(tokenizer=realsize.tokenizer(), scheduler=scheduler, **parts, **extra)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def plain_setup(pipe, recipe: str) -> None:
    if recipe == "to_cuda":
        pipe.to("cuda")
        return
    pipe.vae.enable_tiling()
    if recipe == "model_cpu_offload":
        pipe.enable_model_cpu_offload()
    else:
        pipe.enable_sequential_cpu_offload()


def plain_run(pipe, preset, steps: int, prompt: str, image) -> dict:
    import torch

    marks = {}

    def first_call(*_):
        marks.setdefault("first", time.perf_counter())   # returns None: the inputs are left as they are

    handle = pipe.transformer.register_forward_pre_hook(first_call)
    step_ends = []

    def on_step_end(pipeline, i, t, tensors):
        torch.cuda.synchronize()
        step_ends.append(time.perf_counter())
        return {}

    extra = {"image": image} if image is not None else {}
    started = time.perf_counter()
    try:
        pipe(prompt=prompt, negative_prompt=preset.negative_prompt, height=preset.settings.height, width=preset.settings.width,
             num_frames=preset.settings.frames, num_inference_steps=steps, guidance_scale=preset.settings.guidance,
             generator=torch.Generator("cpu").manual_seed(1), output_type="np", callback_on_step_end=on_step_end,
             **extra)
        torch.cuda.synchronize()
    finally:
        handle.remove()
    ended = time.perf_counter()
    steps_s = [b - a for a, b in zip([marks["first"]] + step_ends[:-1], step_ends)]
    return {"before_denoise_s": marks["first"] - started, "denoise_s": step_ends[-1] - marks["first"],
            "decode_s": ended - step_ends[-1], "mean_step_s": sum(steps_s) / len(steps_s)}


def run_plain(key: str, preset, steps: int, image, fraction: float) -> list[dict]:
    import torch

    rows = []
    for recipe in RECIPES:
        torch.cuda.set_per_process_memory_fraction(1.0)
        pipe = plain_pipeline(key, preset)
        torch.cuda.set_per_process_memory_fraction(fraction)
        torch.cuda.reset_peak_memory_stats()
        done = False
        for attempt, prompt in enumerate(PROMPTS, start=1):
            row = {"runner": "diffusers", "recipe": recipe, "run": attempt}
            started = time.perf_counter()
            try:
                setup = 0.0
                if attempt == 1:
                    plain_setup(pipe, recipe)
                    setup = time.perf_counter() - started
                row.update(plain_run(pipe, preset, steps, prompt, image), setup_s=setup)
                row["status"] = "ok"
            except torch.OutOfMemoryError as exc:
                row["status"] = f"out of memory: {str(exc).splitlines()[0][:160]}"
            row["seconds"] = time.perf_counter() - started
            row["peak_vram_gb"] = torch.cuda.max_memory_allocated() / GIB
            torch.cuda.reset_peak_memory_stats()
            rows.append(row)
            print(json.dumps(rounded(row)), flush=True)
            if row["status"] != "ok":
                break
            done = attempt == len(PROMPTS)
        pipe.remove_all_hooks()
        del pipe
        gc.collect()
        torch.cuda.empty_cache()
        if done:
            break
    torch.cuda.set_per_process_memory_fraction(1.0)
    return rows


# ----- the engine -------------------------------------------------------------------------------------
def run_engine(key: str, preset, steps: int, image_path: Path | None, budget: float | None, work: Path) -> list[dict]:
    import psutil
    import torch

    from bench.validate_memory import BenchEngine
    from engine.device.hardware import HardwareProfile
    from engine.events import JobFinished, PlanReady
    from engine.settings.request import GenerationRequest

    total = torch.cuda.get_device_properties(0).total_memory / GIB
    card = budget or round(total, 1)
    fraction = min(1.0, card / total)
    ram = psutil.virtual_memory()
    hardware = HardwareProfile(backend="cuda", device_name=f"{torch.cuda.get_device_name(0)} as {card:g} GB",
                               arch="sm_90", vram_total_gb=card, vram_free_gb=card,
                               ram_total_gb=round(ram.total / GIB, 1), ram_available_gb=round(ram.available / GIB, 1))
    torch.cuda.set_per_process_memory_fraction(fraction)
    engine = BenchEngine(key, work / "empty-model", hardware, fraction)
    rows = []
    for attempt, prompt in enumerate(PROMPTS, start=1):
        request = GenerationRequest.from_preset(preset, prompt, model=preset.settings.model, steps=steps, seed=1,
                                                image=str(image_path) if image_path else None,
                                                outputs_dir=str(work / "out"))
        events = []
        started = time.perf_counter()
        result = engine.run(request, f"engine-{attempt}", events.append)
        wall = time.perf_counter() - started
        row = {"runner": "engine", "recipe": "engine", "run": attempt}
        if isinstance(result, JobFinished):
            timings = result.timings
            sidecar = json.loads(Path(result.sidecar).read_text())
            plan = [e.plan.to_dict() for e in events if isinstance(e, PlanReady)][-1]
            setup = timings.get("transfer", 0.0)
            before = sum(timings.get(k, 0.0) for k in ("transfer", "text_encode", "image_encode"))
            row.update(status="ok", setup_s=setup, before_denoise_s=before, text_encode_s=timings.get("text_encode"),
                       denoise_s=timings["denoise"],
                       decode_s=timings.get("vae_decode", 0.0),
                       mean_step_s=sum(sidecar["step_seconds"]) / len(sidecar["step_seconds"]),
                       # The engine's "load" here builds the random weights: left out, as on the other side.
                       seconds=wall - timings.get("load", 0.0) - timings.get("export", 0.0),
                       peak_vram_gb=result.peak_vram_gb, strategy=plan["strategy"],
                       text_encoder=plan.get("text_encoder"), vae_tile=plan.get("vae_tile"))
        else:
            row.update(status=f"{type(result).__name__}: {getattr(result, 'message', '')}", seconds=wall)
        rows.append(row)
        print(json.dumps(rounded(row)), flush=True)
        if row["status"] != "ok":
            break
    engine.unload()
    del engine
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(1.0)
    return rows


def rounded(row: dict) -> dict:
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}


# ----- the table -------------------------------------------------------------------------------------
def table(files: list[str]) -> str:
    """Per case and run: the engine's wall time and peak next to the plain recipe that completed."""
    lines = ["| case | run | plain diffusers (first recipe that completed) | s | peak GiB | engine plan | s | peak GiB "
             "| engine time / diffusers time |",
             "|---|---|---|--:|--:|---|--:|--:|--:|"]
    for name in files:
        data = json.loads(Path(name).read_text())
        for case in data["cases"]:
            plain = [r for r in case["rows"] if r["runner"] == "diffusers"]
            done = [r for r in plain if r["status"] == "ok"]
            recipe = done[0]["recipe"] if done else None
            failed = sorted({r["recipe"] for r in plain if r["status"] != "ok"})
            for run in (1, 2):
                base = next((r for r in done if r["run"] == run), None)
                mine = next((r for r in case["rows"] if r["runner"] == "engine" and r["run"] == run), None)
                if mine is None or mine["status"] != "ok":
                    continue
                plan = f"{mine['strategy']}, text encoder {mine['text_encoder']}, tiles {mine['vae_tile'] or '-'}"
                what = recipe or "none completed"
                if failed:
                    what += f" ({', '.join(failed)}: out of memory)"
                plain_s, plain_peak, ratio = ((f"{base['seconds']:.1f}", f"{base['peak_vram_gb']:.1f}",
                                               f"{mine['seconds'] / base['seconds']:.2f}x") if base else ("-",) * 3)
                lines.append(f"| {case['case']} ({case['preset']}, {case['steps']} steps) | {run} | {what} | "
                             f"{plain_s} | {plain_peak} | {plan} | {mine['seconds']:.1f} | "
                             f"{mine['peak_vram_gb']:.1f} | {ratio} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", nargs="+")
    parser.add_argument("--cases", default="1.3b@full,1.3b@12,14b@24")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--table", action="store_true")
    args = parser.parse_args()
    if args.table:
        print(table(args.out))
        return

    import torch
    from PIL import Image

    from engine.settings.presets import load_presets

    presets = load_presets()
    work = Path("/tmp/wan-vs-diffusers")
    (work / "empty-model").mkdir(parents=True, exist_ok=True)
    image_path = work / "first-frame.png"
    Image.new("RGB", (640, 608), (180, 90, 40)).save(image_path)
    total = torch.cuda.get_device_properties(0).total_memory / GIB
    out = Path(args.out[0])
    cases = []
    for case in args.cases.split(","):
        model, card = parse_case(case)
        preset_name, key = CASE_MODELS[model]
        preset = presets[preset_name]
        steps = min(args.steps, preset.settings.steps)
        image = Image.open(image_path).convert("RGB") if preset.settings.mode == "i2v" else None
        fraction = min(1.0, (card or total) / total)
        entry = {"case": f"{model} on {'the whole H200' if card is None else f'{card:g} GiB'}", "preset": preset.name,
                 "steps": steps, "card_gib": card or round(total, 1), "rows": []}
        cases.append(entry)
        entry["rows"] += run_plain(key, preset, steps, image, fraction)
        entry["rows"] += run_engine(key, preset, steps, image_path if image else None, card, work)
        out.write_text(json.dumps({"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                                   "cases": [{**c, "rows": [rounded(r) for r in c["rows"]]} for c in cases]},
                                  indent=2))


if __name__ == "__main__":
    main()
