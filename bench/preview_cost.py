"""What the live preview costs on a GPU: the same run with previews off, once a second, and every step.

    python bench/preview_cost.py OUT.json [--models 1.3b,5b] [--steps 6] [--repeats 2]

Real-size random-weight models (bench/realsize.py) run through the engine's own code path. For each
model the runs alternate (off, 1 s, every step) after a warm-up run, so the loaded model, the device
clocks and the caches are the same for all three. Recorded per run: the denoise phase, the mean step,
the previews made and what each cost, and a snapshot of the engine's memory read from another thread
during the run (what the page's system panel shows).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import psutil  # noqa: E402
import torch  # noqa: E402

from bench.validate_memory import MODELS, BenchEngine  # noqa: E402
from engine.device.hardware import GIB, HardwareProfile  # noqa: E402
from engine.device.usage import engine_memory  # noqa: E402
from engine.events import JobFinished, PreviewReady, StepFinished  # noqa: E402
from engine.settings.presets import load_presets  # noqa: E402
from engine.settings.request import GenerationRequest  # noqa: E402

SETTINGS = {"off": -1.0, "every 1 s": 1.0, "every step": 0.0}


def run(engine: BenchEngine, preset, steps: int, work: Path, setting: str) -> dict:
    engine.preview_seconds = SETTINGS[setting]
    request = GenerationRequest.from_preset(preset, "a red fox running through fresh snow", model=preset.settings.model,
                                            steps=steps, seed=1, outputs_dir=str(work / "out"))
    events, snapshot = [], {}

    def emit(event):
        events.append(event)
        if isinstance(event, StepFinished) and event.step == 2 and not snapshot:
            # Read the way the worker's status thread reads it: from another thread, mid-run.
            reader = threading.Thread(target=lambda: snapshot.update(
                engine_memory("cuda", torch.cuda.get_device_name(0), preset.settings.model, "bench").to_dict()))
            reader.start()
            reader.join()

    started = time.perf_counter()
    result = engine.run(request, f"{preset.name}-{setting}", emit)
    if not isinstance(result, JobFinished):
        return {"setting": setting, "status": f"{type(result).__name__}: {getattr(result, 'message', '')}"}
    previews = [e for e in events if isinstance(e, PreviewReady)]
    steps_s = [e.seconds for e in events if isinstance(e, StepFinished)]
    return {
        "preset": preset.name, "setting": setting, "seconds": round(time.perf_counter() - started, 2),
        "denoise_s": round(result.timings["denoise"], 3), "mean_step_s": round(sum(steps_s) / len(steps_s), 4),
        "previews": len(previews), "preview_cost_s": [round(p.seconds, 4) for p in previews],
        "preview_bytes": [len(p.image) for p in previews], "preview_source": previews[0].source if previews else None,
        "preview_size": [previews[0].width, previews[0].height, previews[0].frames] if previews else None,
        "memory_mid_run": snapshot, "peak_vram_gb": result.peak_vram_gb,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--models", default="1.3b,5b")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    presets = load_presets()
    work = Path("/tmp/wan-preview-bench")
    (work / "empty-model").mkdir(parents=True, exist_ok=True)
    ram = psutil.virtual_memory()
    total = torch.cuda.get_device_properties(0).total_memory / GIB
    hardware = HardwareProfile(backend="cuda", device_name=torch.cuda.get_device_name(0), arch="sm_90",
                               vram_total_gb=round(total, 1), vram_free_gb=round(total, 1),
                               ram_total_gb=round(ram.total / GIB, 1), ram_available_gb=round(ram.available / GIB, 1))
    rows = []
    out = Path(args.out)
    for key in args.models.split(","):
        preset = presets[MODELS[key][0][0]]
        engine = BenchEngine(key, work / "empty-model", hardware, 1.0)
        warm = run(engine, preset, args.steps, work, "every step")   # load, compile caches, derive a map
        print(json.dumps({"warm_up": warm}), flush=True)
        for _ in range(args.repeats):
            for setting in SETTINGS:
                row = run(engine, preset, args.steps, work, setting)
                print(json.dumps(row), flush=True)
                rows.append(row)
                out.write_text(json.dumps({"device": torch.cuda.get_device_name(0), "steps": args.steps,
                                           "rows": rows}, indent=2))
        engine.unload()
        del engine
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
