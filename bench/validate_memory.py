"""Check the planner against a real GPU: emulate smaller cards and run each preset through the engine.

    python bench/validate_memory.py OUT.json [--models 1.3b,5b,14b] [--budgets 48,24,16,12,8]
    python bench/validate_memory.py OUT.json --tiny   # the same code on the CPU with the self-test models (CI)

For every budget the GPU is capped with torch.cuda.set_per_process_memory_fraction, the
engine is told the card has that much memory, and each preset that the planner says fits
runs through the engine's own code path (planning, placement, offload hooks, encode,
denoise, decode) with real-size random-weight models. Recorded per run: the strategy,
the predicted and the measured peak device memory, the step time and any step-down. ``--tiny`` runs each
self-test preset through the same cases on the CPU (the engine loads the self-test folders as users load
models; the peak compared is RAM's), so the script cannot rot between GPU runs.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import psutil  # noqa: E402
import torch  # noqa: E402

from bench import realsize  # noqa: E402
from engine.device.hardware import GIB, HardwareProfile  # noqa: E402
from engine.events import JobFinished, PlanReady  # noqa: E402
from engine.models.refs import ResolvedModel  # noqa: E402
from engine.models.spec import spec_for  # noqa: E402
from engine.run.apply_plan import loaded_into_ram  # noqa: E402
from engine.run.engine import Engine  # noqa: E402
from engine.settings.presets import load_presets  # noqa: E402
from engine.settings.request import GenerationRequest  # noqa: E402

MODELS = {  # model key -> (presets, transformer, pipeline class, wan2.2 VAE)
    "1.3b": (("wan21-t2v-1.3b", "fastwan21-t2v-1.3b-quick"), "wan21-1.3b", "WanPipeline", False),
    "5b": (("wan22-ti2v-5b",), "wan22-5b", "WanPipeline", True),
    "14b": (("wan21-i2v-14b",), "wan21-i2v-14b", "WanImageToVideoPipeline", False),
}
STEPS = 2   # memory does not depend on the step count; FastWan keeps its 3 fixed steps


def build_parts(key: str, device: str) -> dict:
    """Every component of one model, random weights at full size, built on the GPU then moved to ``device``."""
    _, transformer, pipeline, wan22 = MODELS[key]
    torch.manual_seed(0)   # the same weights every time: the engine's run compares with plain diffusers'
    parts = {"transformer": realsize.transformer(transformer), "vae": realsize.vae(wan22),
             "text_encoder": realsize.text_encoder()}
    if pipeline == "WanImageToVideoPipeline":
        parts["image_encoder"], parts["image_processor"] = realsize.image_encoder()
    if device != "cuda":
        for part in parts.values():
            if isinstance(part, torch.nn.Module):
                part.to(device)
    return parts


class BenchEngine(Engine):
    """The real engine, except that 'loading' builds random-weight components instead of reading files.

    The GPU cap is lifted while the parts are built and the peak counter is reset afterwards, so the
    measured peak covers placement, encoding, denoising and decoding: what the planner predicts.
    """

    def __init__(self, key: str, folder: Path, hardware: HardwareProfile, fraction: float):
        super().__init__(folder, hardware)
        self.key, self.folder, self.fraction = key, folder, fraction

    def use_budget(self, hardware: HardwareProfile, fraction: float) -> None:
        self.use_hardware(hardware)
        self.fraction = fraction

    def resolve(self, ref, job):
        pipeline = MODELS[self.key][2]
        parts = ("transformer", "vae", "text_encoder") + (("image_encoder",) if "Image" in pipeline else ())
        return ResolvedModel(ref, self.folder, "bench", "random-weights", pipeline, parts,
                             spec=spec_for(ref, self.folder))

    @contextmanager
    def uncapped(self):
        """The block builds parts with the GPU cap lifted; afterwards the cap is back and the peak counter reset."""
        torch.cuda.set_per_process_memory_fraction(1.0)
        try:
            yield
        finally:
            gc.collect()
            torch.cuda.empty_cache()
            torch.cuda.set_per_process_memory_fraction(self.fraction)
            torch.cuda.reset_peak_memory_stats()

    def _from_pretrained(self, resolved, plan):
        from diffusers import UniPCMultistepScheduler, WanImageToVideoPipeline, WanPipeline

        with self.uncapped():
            parts = build_parts(self.key, "cuda" if plan.load == "device_map" else "cpu")
            for name in loaded_into_ram(plan):      # as the engine's loader does (engine/run/apply_plan.py)
                if name in parts:
                    parts[name].to("cpu")
            vae, dtype = parts["vae"], getattr(torch, plan.vae_dtype)   # as the engine loads and places it:
            vae.decoder.to(dtype), vae.post_quant_conv.to(dtype)         # the decoder in the plan's dtype,
            if "image_encoder" not in parts:                              # the encoder float32 for image to video
                vae.encoder.to(dtype), vae.quant_conv.to(dtype)
        scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0)
        cls = WanImageToVideoPipeline if resolved.pipeline_class == "WanImageToVideoPipeline" else WanPipeline
        extra = {"expand_timesteps": True} if self.key == "5b" else {}
        pipe = cls(tokenizer=realsize.tokenizer(), scheduler=scheduler, **parts, **extra)
        pipe.set_progress_bar_config(disable=True)
        return pipe


def run_case(engine: Engine, preset, budget_gb: float, work: Path, image: Path, model: str | None = None) -> dict:
    steps = preset.settings.steps if preset.settings.sigmas else STEPS
    request = GenerationRequest.from_preset(
        preset, "a red fox running through fresh snow, cinematic", model=model or preset.settings.model, steps=steps,
        seed=1, image=str(image) if preset.settings.mode == "i2v" else None, outputs_dir=str(work / "out"))
    spec = spec_for(model, Path(model)) if model else spec_for(preset.settings.model, None)
    size = engine.plan_for(request, spec)
    peak = "predicted_peak_vram_gb" if engine.hardware.device != "cpu" else "predicted_peak_ram_gb"
    row = {"budget_gb": budget_gb, "preset": preset.name, "fits": size.fits, "strategy": size.strategy,
           "text_encoder": size.text_encoder, "vae_tile": size.vae_tile, "load": size.load,
           "predicted_peak_gb": getattr(size, peak)}
    if not size.fits:
        row["status"] = "planner: does not fit"
        return row
    events = []
    started = time.perf_counter()
    result = engine.run(request, f"{preset.name}-{budget_gb}", events.append)
    row["seconds"] = round(time.perf_counter() - started, 2)
    used = [e.plan.to_dict() for e in events if isinstance(e, PlanReady)][-1]
    reused = any("encoding is reused" in getattr(e, "message", "") for e in events)
    phases = {k: v[peak.replace("predicted_", "")] for k, v in used["phases"].items()}
    ran = {k: v for k, v in phases.items() if not (reused and k == "text_encode")}
    row.update(strategy_used=used["strategy"], predicted_phases=phases, prompt_reused=reused,
               predicted_peak_run_gb=round(max(ran.values()), 3))
    if isinstance(result, JobFinished):
        sidecar = json.loads(Path(result.sidecar).read_text())
        measured = result.peak_vram_gb if engine.hardware.device != "cpu" else result.peak_ram_gb
        row.update(status="ok", measured_peak_gb=measured,
                   ratio=round(measured / row["predicted_peak_run_gb"], 3),
                   step_s=round(float(np.mean(sidecar["step_seconds"])), 3), timings=sidecar["timings"],
                   step_downs=sidecar["step_downs"], decode_fallback=sidecar["decode_fallback"])
    else:
        row.update(status=f"{type(result).__name__}: {getattr(result, 'message', '')}")
    return row


def tiny(out: Path, work: Path) -> None:
    """Each self-test preset through run_case on the CPU, its model loaded from a saved folder."""
    from engine.device.hardware import detect_hardware
    from engine.models.selftest import SELFTEST_I2V, SELFTEST_T2V, build_selftest_pipeline

    from bench.speed_setup import leave_libraries_out_of_collections

    leave_libraries_out_of_collections()   # the engine's unload between the presets: past the libraries' objects
    presets, rows = load_presets(), []
    image = work / "first-frame.png"
    from PIL import Image
    Image.new("RGB", (64, 64), (180, 90, 40)).save(image)
    engine = Engine(work / "models", detect_hardware())
    for ref in (SELFTEST_T2V, SELFTEST_I2V):
        folder = work / "models" / ref
        if not folder.exists():
            build_selftest_pipeline(ref).save_pretrained(folder)
        row = run_case(engine, presets[ref], 0.0, work, image, model=str(folder))
        print(json.dumps(row), flush=True)
        rows.append(row)
    out.write_text(json.dumps({"device": "cpu", "rows": rows}, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--models", default="1.3b,5b,14b")
    parser.add_argument("--budgets", default="48,24,16,12,8")
    parser.add_argument("--tiny", action="store_true", help="the self-test models on the CPU (checks the code)")
    parser.add_argument("--work", default="/tmp/wan-bench", help="a folder for the models and outputs it makes")
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    if args.tiny:
        return tiny(Path(args.out), work)
    total_gb = torch.cuda.get_device_properties(0).total_memory / GIB
    presets = load_presets()
    (work / "empty-model").mkdir(parents=True, exist_ok=True)
    image = work / "first-frame.png"
    from PIL import Image
    Image.new("RGB", (640, 608), (180, 90, 40)).save(image)
    ram = psutil.virtual_memory()
    rows = []
    out = Path(args.out)
    for key in args.models.split(","):
        engine = None
        for budget in (float(b) for b in args.budgets.split(",")):
            fraction = min(1.0, budget / total_gb)
            torch.cuda.set_per_process_memory_fraction(fraction)
            hardware = HardwareProfile(backend="cuda", device_name=f"H200 capped at {budget:g} GB", arch="sm_90",
                                       vram_total_gb=budget, vram_free_gb=budget,
                                       ram_total_gb=round(ram.total / GIB, 1),
                                       ram_available_gb=round(psutil.virtual_memory().available / GIB, 1))
            if engine is None:
                engine = BenchEngine(key, work / "empty-model", hardware, fraction)
            else:
                engine.use_budget(hardware, fraction)
            for name in MODELS[key][0]:
                row = run_case(engine, presets[name], budget, work, image)
                print(json.dumps(row), flush=True)
                rows.append(row)
                out.write_text(json.dumps({"device": torch.cuda.get_device_name(0), "rows": rows}, indent=2))
            engine.unload()
        del engine
        gc.collect()
        torch.cuda.set_per_process_memory_fraction(1.0)


if __name__ == "__main__":
    main()
