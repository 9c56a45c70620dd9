"""What the speed benchmark's parts share (bench/speed.py): the set-up of one model's runs, the device's clock and
peaks, the model's folder, and one run each of plain diffusers and of the engine."""
from __future__ import annotations

import gc
import json
import subprocess
import sys
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ("a red fox running through fresh snow, cinematic", "a paper boat drifting down a rainy street")
NEGATIVE = "blurry, low quality"


@dataclass
class Setup:
    """Where and how big: the GPU with real sizes, or the CPU with the self-test model (--tiny)."""
    tiny: bool
    work: Path
    device: str = "cuda"
    width: int = 832
    height: int = 480
    frames: int = 81
    long_steps: int = 50
    cache_steps: int = 20
    cold_steps: int = 10
    results: dict = field(default_factory=dict)
    out: Path | None = None
    cases: tuple[str, ...] = ("fastwan", "long")   # the warm part's cases (bench/speed.py)

    @classmethod
    def make(cls, tiny: bool, work: Path, out: Path) -> "Setup":
        if tiny:
            return cls(True, work, "cpu", 64, 64, 9, long_steps=6, cache_steps=8, cold_steps=2, out=out)
        return cls(False, work, out=out)

    def save(self) -> None:
        self.out.write_text(json.dumps(self.results, indent=2, default=str))


@contextmanager
def part(setup: Setup, name: str):
    """One measurement: its failure is recorded (with the traceback) and the next one runs."""
    print(f"[bench] {name} ...", flush=True)
    started = time.perf_counter()
    try:
        yield
    except Exception as exc:  # the run goes on: one broken part must not cost the others
        traceback.print_exc()
        setup.results.setdefault("failures", {})[name] = f"{type(exc).__name__}: {exc}"
    finally:
        print(f"[bench] {name} done in {time.perf_counter() - started:.1f} s", flush=True)
        free()
        setup.save()


def leave_libraries_out_of_collections(engine: bool = True) -> None:
    """For a --tiny run: everything alive now (mostly the imported libraries' functions, classes and dicts) is left
    out of the garbage collector's later passes (``gc.freeze``), the libraries an engine run uses loaded first
    with ``engine``, as an engine process loads them (engine/device/runtime.py ``load_libraries``). Each ``gc.collect()`` of a tiny run (``free`` here, the engine's unload) then walks only what
    the run made since, not the libraries again (0.2-0.3 s a pass otherwise, dozens of passes a run, for models of
    a few megabytes), and so does the process's exit (1 s otherwise). What the run computes is the same; only an
    object alive now that becomes cyclic garbage later stays in memory."""
    if engine:
        import importlib

        from engine.device.runtime import load_libraries

        load_libraries()
        importlib.import_module("engine.run.engine")
    gc.collect()
    gc.freeze()


def free() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def peak_reset() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()


def peak_gb() -> float | None:
    import torch

    return round(torch.cuda.max_memory_allocated() / 1024 ** 3, 3) if torch.cuda.is_available() else None


# ----- the model on disk -------------------------------------------------------------------------------
def build_folder(setup: Setup) -> Path:
    """The 1.3B text-to-video model saved as a diffusers folder as its repository stores it (the self-test model with
    --tiny)."""
    folder = setup.work / "wan13"
    if (folder / "model_index.json").exists():
        return folder
    started = time.perf_counter()
    if setup.tiny:
        from engine.models.selftest import SELFTEST_T2V, build_selftest_pipeline

        pipe = build_selftest_pipeline(SELFTEST_T2V)
    else:
        from diffusers import UniPCMultistepScheduler, WanPipeline

        from bench import realsize

        pipe = WanPipeline(tokenizer=realsize.tokenizer(), text_encoder=realsize.text_encoder(),
                           vae=realsize.vae(), transformer=realsize.transformer("wan21-1.3b"),
                           scheduler=UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True,
                                                             flow_shift=3.0))
        pipe.to("cpu")
    if setup.tiny:
        pipe.save_pretrained(folder)
    else:   # as the published repository stores it: float32 shards with index files
        realsize.save_as_published(pipe, folder)
    del pipe
    from engine.models.weights import weight_bytes

    setup.results["folder"] = {"gb": round(weight_bytes(folder) / 1024 ** 3, 2),
                               "seconds": round(time.perf_counter() - started, 1)}
    return folder


# ----- the machine's rates, measured once (as the engine does before its first job) -------------------------
def measure_machine(setup: Setup, engine) -> None:
    """The engine's calibration, kept where its runs (and the cold run's process) look for it."""
    import shutil

    out = setup.work / "out"
    started = time.perf_counter()
    calibration = engine.timing.calibration(out, engine.hardware, lambda work: work())
    setup.results["calibration"] = {"seconds": round(time.perf_counter() - started, 2), **calibration.to_dict()}
    (setup.work / "cold-out").mkdir(parents=True, exist_ok=True)
    from engine.device.calibrate import CALIBRATION_FILE

    shutil.copy(out / CALIBRATION_FILE, setup.work / "cold-out" / CALIBRATION_FILE)


# ----- cold: two fresh processes --------------------------------------------------------------------------
def cold(setup: Setup, folder: Path) -> None:
    size = ["--width", str(setup.width), "--height", str(setup.height), "--frames", str(setup.frames)]
    runs = {
        "plain": [sys.executable, str(ROOT / "bench" / "plain_script.py"), str(folder),
                  str(setup.work / "plain-cold.mp4"), "--steps", str(setup.cold_steps), *size],
        "engine": [sys.executable, str(ROOT / "app.py"), "generate", "--model", str(folder), "--prompt", PROMPTS[0],
                   "--negative-prompt", NEGATIVE, "--steps", str(setup.cold_steps), "--guidance", "5",
                   "--outputs", str(setup.work / "cold-out"), "--models-dir", str(setup.work / "models"), *size],
    }
    rows = {}
    for repeat in (1,):
        for name, command in runs.items():
            started = time.perf_counter()
            done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
            wall = time.perf_counter() - started
            rows.setdefault(name, []).append({"seconds": round(wall, 2), "rc": done.returncode,
                                              "tail": (done.stdout + done.stderr)[-1500:]})
            print(f"[bench] cold {name} #{repeat}: {wall:.1f} s rc {done.returncode}", flush=True)
    best = {name: min(r["seconds"] for r in runs_ if r["rc"] == 0) for name, runs_ in rows.items()
            if any(r["rc"] == 0 for r in runs_)}
    setup.results["cold"] = {"steps": setup.cold_steps, "runs": rows, "best": best,
                             "ratio": round(best["engine"] / best["plain"], 3) if len(best) == 2 else None}


# ----- warm: plain diffusers and the engine in one process ------------------------------------------------
def plain_pipeline(folder: Path, setup: Setup):
    import torch
    from diffusers import AutoencoderKLWan, WanPipeline

    started = time.perf_counter()
    dtype = torch.float32 if setup.tiny else torch.bfloat16
    vae = AutoencoderKLWan.from_pretrained(folder, subfolder="vae", torch_dtype=torch.float32)
    pipe = WanPipeline.from_pretrained(folder, vae=vae, torch_dtype=dtype)
    loaded = time.perf_counter()
    pipe.to(setup.device)
    sync()
    pipe.set_progress_bar_config(disable=True)
    return pipe, {"load_s": round(loaded - started, 3), "to_device_s": round(time.perf_counter() - loaded, 3)}


def plain_video(pipe, setup: Setup, case: dict, prompt: str, out: Path) -> tuple[dict, object]:
    """One video the plain way, timed: (the timings, the final latents)."""
    import torch
    from diffusers.utils import export_to_video

    from engine.run.schedulers import make_scheduler

    pipe.scheduler = make_scheduler(dict(pipe.scheduler.config), case["shift"], case.get("sigmas"),
                                    case.get("scheduler", "unipc"), 1)
    marks, ends, kept = {}, [], {}

    def first_call(*_):
        marks.setdefault("first", time.perf_counter())

    def on_step_end(pipeline, i, t, tensors):
        sync()
        ends.append(time.perf_counter())
        kept["latents"] = tensors["latents"].detach().clone()
        return {}

    handle = pipe.transformer.register_forward_pre_hook(first_call)
    peak_reset()
    started = time.perf_counter()
    try:
        frames = pipe(prompt=prompt, negative_prompt=NEGATIVE, height=setup.height, width=setup.width,
                      num_frames=setup.frames, num_inference_steps=case["steps"], guidance_scale=case["guidance"],
                      generator=torch.Generator("cpu").manual_seed(1), callback_on_step_end=on_step_end).frames[0]
        sync()
    finally:
        handle.remove()
    decoded = time.perf_counter()
    export_to_video(frames, str(out), fps=16)
    done = time.perf_counter()
    steps = [b - a for a, b in zip([marks["first"], *ends[:-1]], ends)]
    return {"seconds": round(done - started, 3), "before_denoise_s": round(marks["first"] - started, 3),
            "denoise_s": round(ends[-1] - marks["first"], 3), "step_s": round(sum(steps) / len(steps), 4),
            "decode_s": round(decoded - ends[-1], 3), "export_s": round(done - decoded, 3),
            "peak_vram_gb": peak_gb()}, kept["latents"]


def engine_video(engine, setup: Setup, case: dict, prompt: str, **settings) -> tuple[dict, object]:
    """One video through the engine, request to mp4 on disk: (timings and plan, the final latents)."""
    from engine.events import Info, JobFinished, PlanReady
    from engine.outputs.latents import load_latents
    from engine.settings.presets import load_presets
    from engine.settings.request import GenerationRequest

    preset = load_presets()[case["preset"]]
    request = GenerationRequest.from_preset(
        preset, prompt, model=case["model"], width=setup.width, height=setup.height, frames=setup.frames,
        steps=case["steps"], guidance=case["guidance"], shift=case["shift"], seed=1,
        outputs_dir=str(setup.work / "out"), keep_latents=True,
        negative_prompt=NEGATIVE, **settings)
    events = []
    peak_reset()
    started = time.perf_counter()
    result = engine.run(request, f"bench-{time.time_ns()}", events.append)
    wall = time.perf_counter() - started
    if not isinstance(result, JobFinished):
        raise RuntimeError(f"the engine's run ended with {result}")
    sidecar = json.loads(Path(result.sidecar).read_text())
    planned = [e for e in events if isinstance(e, PlanReady)][-1]
    plan = planned.plan.to_dict()
    latents, _ = load_latents(Path(sidecar["latents"]))
    row = {"seconds": round(wall, 3), "timings": result.timings,
           "step_s": round(sum(sidecar["step_seconds"]) / len(sidecar["step_seconds"]), 4),
           "peak_vram_gb": result.peak_vram_gb, "peak_ram_gb": result.peak_ram_gb,
           "plan": {k: plan.get(k) for k in ("strategy", "vae_dtype", "conv", "compile", "attention_backend",
                                             "text_encoder", "vae_tile", "guidance_batch", "fp8_compute",
                                             "decode_window", "channels_last")},
           "predicted": planned.predicted_seconds, "speed": sidecar.get("speed"),
           "notes": [e.message for e in events if isinstance(e, Info)][-6:]}
    return row, latents


def difference(a, b) -> float:
    return round(float((a.float().cpu() - b.float().cpu()).abs().max()), 6)


def relative_difference(a, b) -> float:
    """|a - b| / |b| over the whole tensor (an approximate path's distance from the exact one)."""
    a, b = a.float().cpu(), b.float().cpu()
    return round(float((a - b).norm() / b.norm().clamp_min(1e-12)), 6)
