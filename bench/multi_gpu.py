"""Every GPU in the box, measured: one job on one GPU against the same job split across two, and two jobs on
two engines against the same two on one.

    python bench/multi_gpu.py OUT.json [--models 1.3b,14b,ring]  # a machine with two GPUs
    python bench/multi_gpu.py OUT.json --tiny                 # two CPU engines, the self-test model (CI)
    python bench/multi_gpu.py --table OUT.json                # the markdown table of docs/speed.md

Everything goes through the app's own path: an EnginePool of two engine processes (one per GPU, as
``serve --gpus 2`` starts them) given requests as the queue gives them. The models are saved to disk first
(real-size random weights, in float32 shards as the repositories store them: Wan2.1 T2V 1.3B, and Wan2.1 T2V 14B,
40 heads), since every engine process loads its own copy. Per model:

- whole: the job on engine 0 alone (after a warm-up run that loads it), per-step time and request to mp4;
- split: the same job split across both engines (context parallel; a warm-up run first), the same figures,
  and the final latents' largest difference from the whole run's;
- queue: two jobs at once, one per engine, against the same two jobs one after the other on one engine (wall
  time from the first request to the last mp4): the throughput ratio.

Last, "ring": a tiny random model with three attention heads, which two GPUs do not divide, split with an
attention backend that returns the log-sum-exp (Ring attention), against the same model whole. (Two engines
cannot share one GPU for this: NCCL refuses two ranks on one device, and gloo, which could, crashes gathering
GPU tensors: bench/collectives_probe.py.)

Nothing here asserts a time: the numbers are the output.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PROMPTS = ("a red fox running through fresh snow, cinematic", "a paper boat drifting down a rainy street")
# model key -> (preset, realsize transformer, steps per measured run, guidance)
MODELS = {"1.3b": ("wan21-t2v-1.3b", "wan21-1.3b", 10, 5.0), "14b": ("wan21-t2v-14b-480p", "wan21-t2v-14b", 5, 5.0),
          "ring": ("selftest-t2v", "", 4, 5.0)}
# The tiny model of the "ring" part: three attention heads, which two GPUs do not divide (Ring, not Ulysses),
# run with an attention backend that returns the log-sum-exp.
RING_HEADS, RING_ATTENTION = 3, "_native_flash"
TINY_SIZE, FULL_SIZE = (64, 64, 9), (832, 480, 81)


@dataclass
class Setup:
    tiny: bool
    work: Path
    out: Path
    size: tuple[int, int, int] = FULL_SIZE
    results: dict = field(default_factory=dict)

    def size_of(self, key: str) -> tuple[int, int, int]:
        return TINY_SIZE if self.tiny or key == "ring" else self.size

    def steps_of(self, key: str) -> int:
        return 4 if self.tiny else MODELS[key][2]

    def save(self) -> None:
        self.out.write_text(json.dumps(self.results, indent=2, default=str))


def build_folder(setup: Setup, key: str) -> Path:
    """The model saved as a diffusers folder inside the pool's models folder (the self-test model with --tiny)."""
    folder = setup.work / "models" / f"bench-{key}"
    if (folder / "model_index.json").exists():
        return folder
    started = time.perf_counter()
    if setup.tiny or key == "ring":
        from engine.models.selftest import SELFTEST_T2V, build_selftest_pipeline

        pipe = build_selftest_pipeline(SELFTEST_T2V)
        if key == "ring":
            import torch
            from diffusers import WanTransformer3DModel

            width = pipe.transformer.config.num_attention_heads * pipe.transformer.config.attention_head_dim
            torch.manual_seed(0)
            pipe.transformer = WanTransformer3DModel.from_config(
                {**pipe.transformer.config, "num_attention_heads": RING_HEADS,
                 "attention_head_dim": width // RING_HEADS})
    else:
        from diffusers import UniPCMultistepScheduler, WanPipeline

        from bench import realsize

        pipe = WanPipeline(tokenizer=realsize.tokenizer(), text_encoder=realsize.text_encoder(), vae=realsize.vae(),
                           transformer=realsize.transformer(MODELS[key][1]),
                           scheduler=UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True,
                                                             flow_shift=3.0))
        pipe.to("cpu")
        realsize.save_as_published(pipe, folder)   # float32 shards with index files, as the repositories store it
    if not (folder / "model_index.json").exists():
        pipe.save_pretrained(folder)
    del pipe
    import torch

    if torch.cuda.is_available():   # the engines need the GPUs' memory: this process keeps none of it
        torch.cuda.empty_cache()
    setup.results.setdefault(key, {})["folder_s"] = round(time.perf_counter() - started, 1)
    return folder


def request(setup: Setup, key: str, folder: Path, prompt: str, gpus: int):
    from engine.settings.presets import load_presets
    from engine.settings.request import GenerationRequest

    preset_name, _, _, guidance = MODELS[key]
    width, height, frames = setup.size_of(key)
    return GenerationRequest.from_preset(
        load_presets()[preset_name if not setup.tiny else "selftest-t2v"], prompt, model=str(folder), width=width,
        height=height, frames=frames, steps=setup.steps_of(key), guidance=guidance, seed=7,
        outputs_dir=str(setup.work / "out"), keep_latents=True, gpus=gpus,
        attention=RING_ATTENTION if key == "ring" else None)


def video(pool, req, slots: tuple[int, ...]) -> dict:
    """One job through the pool on ``slots``, request to mp4 on disk: wall time, per-step times, latents file."""
    from engine.events import JobFinished, StepFinished

    steps, started = [], time.perf_counter()
    finished = None
    for event in pool.run(req, slots=slots):
        if isinstance(event, StepFinished):
            steps.append(event.seconds)
        finished = event
    wall = time.perf_counter() - started
    if not isinstance(finished, JobFinished):
        raise RuntimeError(f"the job ended with {finished}")
    sidecar = json.loads(Path(finished.sidecar).read_text())
    # The first step may include compiling or cuDNN's first calls: the step figure is the median of the rest.
    settled = sorted(steps[1:] or steps)
    return {"seconds": round(wall, 3), "step_s": round(settled[len(settled) // 2], 4),
            "steps": [round(s, 4) for s in steps], "peak_vram_gb": finished.peak_vram_gb,
            "timings": finished.timings, "latents": sidecar.get("latents"), "split": (sidecar.get("plan") or {}).get("split")}


def latents_difference(a: str, b: str) -> float:
    from engine.outputs.latents import load_latents

    first, _ = load_latents(Path(a))
    second, _ = load_latents(Path(b))
    return float((first.float() - second.float()).abs().max())


def measure(setup: Setup, key: str) -> None:
    folder = build_folder(setup, key)
    if setup.tiny:   # past the libraries' objects at the exit
        from bench.speed_setup import leave_libraries_out_of_collections

        leave_libraries_out_of_collections(engine=False)
    results = setup.results.setdefault(key, {})
    results["size"] = list(setup.size_of(key))
    pool = start_pool(setup)
    try:
        results["engines"] = len(pool.engines)
        whole = request(setup, key, folder, PROMPTS[0], gpus=1)
        split = request(setup, key, folder, PROMPTS[0], gpus=2)
        # A warm-up run before each measured one loads the model (on engine 0, then on engine 1 too); --tiny, which
        # checks the code, measures the first runs.
        if not setup.tiny:
            video(pool, whole, (0,))
        results["whole"] = video(pool, whole, (0,))
        setup.save()
        if not setup.tiny:
            video(pool, split, (0, 1))
        results["split"] = video(pool, split, (0, 1))
        results["split_latents_vs_whole"] = latents_difference(results["split"]["latents"],
                                                               results["whole"]["latents"])
        results["step_speedup"] = round(results["whole"]["step_s"] / results["split"]["step_s"], 3)
        results["request_speedup"] = round(results["whole"]["seconds"] / results["split"]["seconds"], 3)
        setup.save()
        two = [request(setup, key, folder, prompt, gpus=1) for prompt in PROMPTS]
        started = time.perf_counter()
        for job in two:
            video(pool, job, (0,))
        one_engine = time.perf_counter() - started
        started, done = time.perf_counter(), []
        threads = [threading.Thread(target=lambda job=job, slot=slot: done.append(video(pool, job, (slot,))))
                   for slot, job in enumerate(two)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        two_engines = time.perf_counter() - started
        if len(done) != 2:
            raise RuntimeError("a job of the two on two engines did not finish")
        results["queue"] = {"one_engine_s": round(one_engine, 2), "two_engines_s": round(two_engines, 2),
                            "throughput": round(one_engine / two_engines, 3)}
        setup.save()
    finally:
        pool.close()


def start_pool(setup: Setup):
    """Two engines, as ``serve --gpus 2`` starts them."""
    from engine.service.pool import EnginePool, GpuChoice

    pool = EnginePool(setup.work / "models", GpuChoice(count=2), latents_hours=24.0, preview_seconds=-1)
    pool.start()
    pool.wait_started(600)
    return pool


def table(paths: list[Path]) -> str:
    rows = ["| model | size | step, 1 GPU | step, 2 GPUs | speed-up | request to mp4, 1 GPU | 2 GPUs | latents "
            "vs 1 GPU | 2 jobs: 1 engine | 2 engines | throughput |", "|" + "---|" * 11]
    for path in paths:
        data = json.loads(Path(path).read_text())
        for key in (k for k in MODELS if k in data and "split" in data[k]):
            r = data[key]
            queue = r.get("queue", {})
            size = r.get("size", data["size"])
            rows.append(f"| {key} | {'x'.join(map(str, size))} | {r['whole']['step_s']:.3f} s | "
                        f"{r['split']['step_s']:.3f} s | {r['step_speedup']:.2f}x | {r['whole']['seconds']:.1f} s | "
                        f"{r['split']['seconds']:.1f} s | {r['split_latents_vs_whole']:.3g} | "
                        f"{queue.get('one_engine_s', '-')} s | {queue.get('two_engines_s', '-')} s | "
                        f"{queue.get('throughput', '-')}x |")
        rows.append(f"\n{data.get('machine')}, torch {data.get('torch')}, diffusers {data.get('diffusers')}, "
                    f"{data.get('date')}.")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", nargs="+")
    parser.add_argument("--tiny", action="store_true", help="two CPU engines and the self-test model (checks the code)")
    parser.add_argument("--models", default=None, help="default 1.3b,14b,ring (--tiny: 1.3b, the self-test model)")
    parser.add_argument("--work", default="/tmp/wan-multi")
    parser.add_argument("--table", action="store_true")
    args = parser.parse_args()
    if args.table:
        print(table([Path(p) for p in args.out]))
        return
    import torch

    import diffusers

    out = Path(args.out[0])
    out.parent.mkdir(parents=True, exist_ok=True)
    setup = Setup(args.tiny, Path(args.work), out, TINY_SIZE if args.tiny else FULL_SIZE)
    setup.work.mkdir(parents=True, exist_ok=True)
    setup.results.update(machine=" + ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
                         or "cpu", torch=torch.__version__, diffusers=diffusers.__version__,
                         date=time.strftime("%Y-%m-%d"), size=list(setup.size))
    models = args.models or ("1.3b" if args.tiny else "1.3b,14b,ring")
    for key in models.split(","):
        print(f"[bench] {key} ...", flush=True)
        try:
            measure(setup, key)
        except Exception as exc:   # the next model still runs
            traceback.print_exc()
            setup.results.setdefault("failures", {})[key] = f"{type(exc).__name__}: {exc}"
        setup.save()
    print(f"[bench] results in {out}", flush=True)


if __name__ == "__main__":
    main()
