"""Memory across models, through the WorkerClient as the page drives the engine: many jobs alternating two models,
a GGUF transformer, LoRAs on, off and at changed strengths, the disk rung on an emulated small machine, and an
unload; for each job the peak allocated on the device, what stays allocated after it, and the engine's RSS.

    python bench/memory_soak.py OUT.json --part models,small [--work DIR]   # on a GPU: real-size 1.3B folders
    python bench/memory_soak.py OUT.json --part a14b [--work DIR]     # on a GPU: Wan2.2 A14B, group offload, 24 GB
    python bench/memory_soak.py OUT.json --tiny [--work DIR]          # the same code on the CPU (self-test models)

The second model is a hard-linked copy of the first folder (another path, the same bytes): a swap loads
everything again. Nothing here asserts: docs/memory.md's table is made from the output (bench/soak_table.py).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")

from engine.device.hardware import GIB  # noqa: E402

SMALL = dict(width=480, height=480, frames=25)    # the quick FastWan preset's size: the swaps (their load dominates)
BIG = dict(width=832, height=480, frames=81)      # the step-time comparisons
TINY = dict(width=32, height=32, frames=5)   # --tiny, which checks the code: its jobs at the least cost
SMALL_CARD_GB = 3.5   # with 16 GB of RAM: no rung that keeps the 1.3B's transformer in RAM fits (the disk rung's case)


def fresh_rss(client, poll_s: float = 0.5) -> float | None:
    """The engine process's RSS once it has loaded its libraries and nothing else."""
    from engine.device.usage import EngineMemory

    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        memory = client.memory(timeout=20)
        if isinstance(memory, EngineMemory):
            return memory.engine_ram_gb
        time.sleep(poll_s)
    return None


def settle_s(results: dict) -> float:
    """How long an unloaded engine is given before its memory is read (--tiny checks the code: no figure is kept)."""
    return 0.1 if results["tiny"] else 1.0


@dataclass(frozen=True)
class CapMemory:
    """A phase hook that caps the engine process's device memory at ``fraction`` of the card as its first phase
    starts (an emulated smaller card), and changes nothing else."""
    fraction: float

    def before_phase(self, phase: str) -> None:
        import torch

        if torch.cuda.is_available():
            torch.cuda.set_per_process_memory_fraction(self.fraction)


def rank64_lora(path: Path, width: int, ffn: int, blocks: int, rank: int) -> Path:
    """A LoRA on every attention and FFN linear (Kijai's / lightx2v's layout), random, at ``rank``."""
    import torch
    from safetensors.torch import save_file

    generator, tensors = torch.Generator().manual_seed(0), {}
    shapes = {f"{a}.{p}": (width, width) for a in ("self_attn", "cross_attn") for p in ("q", "k", "v", "o")}
    shapes.update({"ffn.0": (width, ffn), "ffn.2": (ffn, width)})
    for block in range(blocks):
        for name, (fan_in, fan_out) in shapes.items():
            key = f"diffusion_model.blocks.{block}.{name}"
            tensors[f"{key}.lora_down.weight"] = (torch.randn(rank, fan_in, generator=generator) * 0.01).to(torch.bfloat16)
            tensors[f"{key}.lora_up.weight"] = (torch.randn(fan_out, rank, generator=generator) * 0.01).to(torch.bfloat16)
            tensors[f"{key}.alpha"] = torch.tensor(float(rank))
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path))
    return path


def make_models(work: Path, tiny: bool) -> dict:
    """{"a", "b": model folders (b hard-linked from a), "lora": a LoRA file, "gguf": a Q8_0 transformer file}."""
    models = work / "models"
    a = models / "wan13-a"
    if not a.exists():
        if tiny:
            from engine.models.selftest import SELFTEST_T2V, build_selftest_pipeline
            build_selftest_pipeline(SELFTEST_T2V).save_pretrained(a)
        else:
            from diffusers import UniPCMultistepScheduler, WanPipeline

            from bench import realsize
            pipe = WanPipeline(tokenizer=realsize.tokenizer(), text_encoder=realsize.text_encoder(), vae=realsize.vae(),
                               transformer=realsize.transformer("wan21-1.3b"),
                               scheduler=UniPCMultistepScheduler(prediction_type="flow_prediction",
                                                                 use_flow_sigmas=True, flow_shift=8.0))
            pipe.save_pretrained(a)
            del pipe
            gc.collect()
    b = models / "wan13-b"
    if not b.exists():
        shutil.copytree(a, b, copy_function=os.link)
    from safetensors import safe_open
    with safe_open(str(a / "transformer" / "diffusion_pytorch_model.safetensors"), "pt") as f:
        width, ffn = f.get_slice("blocks.0.ffn.net.0.proj.weight").get_shape()[::-1]
        blocks = len({k.split(".")[1] for k in f.keys() if k.startswith("blocks.")})
    lora = rank64_lora(models / "loras" / "r64.safetensors", width, ffn, blocks, 4 if tiny else 64)
    from tests.engine.test_single_file import original_state, write_gguf
    gguf = models / "transformers" / "wan13-Q8_0.gguf"
    if not gguf.exists():
        gguf.parent.mkdir(parents=True, exist_ok=True)
        write_gguf(original_state(a), gguf)
    return {"a": str(a), "b": str(b), "lora": str(lora), "gguf": str(gguf), "models": models}


def run_job(client, tag: str, model: str, preset, outputs: Path, size: dict, **settings) -> dict:
    from engine.events import Info, JobFinished, PlanReady
    from engine.settings.request import GenerationRequest

    request = GenerationRequest.from_preset(preset, f"a paper boat on a pond, {tag}", model=model, seed=1,
                                            outputs_dir=str(outputs), **size, **settings)
    started, last, plan, said = time.perf_counter(), None, None, []
    for event in client.submit(request):
        last = event
        if isinstance(event, PlanReady):
            plan = event.plan.to_dict()
        elif isinstance(event, Info):
            said.append(event.message[:200])
    row = {"tag": tag, "model": Path(model).name, "wall_s": round(time.perf_counter() - started, 2),
           "ended": type(last).__name__, "strategy": plan and plan["strategy"],
           "predicted_peak_vram_gb": plan and plan["predicted_peak_vram_gb"],
           "settings": {k: (str(v) if k == "loras" else v) for k, v in settings.items()}}
    if isinstance(last, JobFinished):
        sidecar = json.loads(Path(last.sidecar).read_text())
        steps = sidecar.get("step_seconds") or []
        row.update(peak_vram_gb=last.peak_vram_gb, timings=last.timings,
                   step_s=round(sum(steps[1:]) / (len(steps) - 1), 4) if len(steps) > 1 else (steps or [None])[0],
                   compiled=sidecar["speed"]["compiled"], loras=sidecar["speed"].get("loras"),
                   loaded=("load" in last.timings))
    else:
        row["message"] = str(getattr(last, "message", last))[:400]
    memory = client.memory(timeout=20)
    row.update(allocated_after_gb=getattr(memory, "vram_engine_gb", None),
               rss_after_gb=getattr(memory, "engine_ram_gb", None),
               said=[s for s in said if "LoRA" in s or "They " in s or "Unloading" in s or "Plan: Slow" in s][:4])
    print("JOB", json.dumps(row, default=str)[:700], flush=True)
    return row


def soak_models(out: Path, work: Path, tiny: bool, parts: tuple = ("models", "small")) -> None:
    """The jobs of ``parts``: "models", two models in turn through one engine (LoRAs, compiling, a GGUF
    transformer), then an unload; "small", the disk rung on an emulated small machine. Saved to ``out`` after
    every job."""
    from engine.settings.presets import load_presets

    results: dict = {"part": "models", "tiny": tiny, "jobs": [], "small_machine": [], "unload": {}}
    started = time.perf_counter()
    files = make_models(work, tiny)
    results["setup_s"] = round(time.perf_counter() - started, 1)
    if tiny:   # past the libraries' objects at the exit
        from bench.speed_setup import leave_libraries_out_of_collections

        leave_libraries_out_of_collections(engine=False)
    save(out, results)
    preset = load_presets()["selftest-t2v" if tiny else "fastwan21-t2v-1.3b-quick"]
    small, big = (TINY, TINY) if tiny else (SMALL, BIG)
    jobs = without_repeated_pairs(swap_jobs(files, small, big)) if tiny else swap_jobs(files, small, big)
    soak_swaps(out, results, files, preset, work, jobs if "models" in parts else [])
    if "small" in parts:
        soak_small_machine(out, results, files, preset, work, tiny, big)
    print("DONE", flush=True)


def save(out: Path, results: dict) -> None:
    out.write_text(json.dumps(results, indent=1, default=str))


def swap_jobs(files: dict, small: dict, big: dict) -> list:
    """(tag, model, size, settings) of every job of the "models" part, in order."""
    from engine.models.loras import Lora

    lora = lambda strength: (Lora(files["lora"], strength),)   # noqa: E731
    a, b = files["a"], files["b"]
    return [
        ("A", a, small, {}), ("B swap", b, small, {}), ("A swap", a, small, {}), ("B swap", b, small, {}),
        ("A swap", a, small, {}), ("A again", a, small, {}),
        ("A big", a, big, {}), ("A big lora 1.0", a, big, {"loras": lora(1.0)}),
        ("A big lora 1.0 again", a, big, {"loras": lora(1.0)}), ("A big lora 0.5", a, big, {"loras": lora(0.5)}),
        ("A big no lora", a, big, {}),
        ("A big compiled", a, big, {"compile": True}), ("A big compiled again", a, big, {"compile": True}),
        ("A big compiled lora 1.0", a, big, {"compile": True, "loras": lora(1.0)}),
        ("A big compiled lora 0.5", a, big, {"compile": True, "loras": lora(0.5)}),
        ("A big compiled no lora", a, big, {"compile": True}),
        ("B swap big", b, big, {}), ("A swap big", a, big, {}),
        ("A gguf", a, big, {"transformer": files["gguf"]}), ("A gguf again", a, big, {"transformer": files["gguf"]}),
        ("A gguf lora 1.0", a, big, {"transformer": files["gguf"], "loras": lora(1.0)}),
        ("A bf16 after gguf", a, big, {}),
        ("B swap", b, small, {}), ("B lora 1.0", b, small, {"loras": lora(1.0)}), ("A swap lora 1.0", a, small,
                                                                                    {"loras": lora(1.0)}),
        ("B swap", b, small, {}), ("A swap", a, small, {}), ("B swap", b, small, {}), ("A swap", a, small, {}),
        ("B swap lora 0.5", b, small, {"loras": lora(0.5)}), ("A swap", a, small, {}),
    ]


def without_repeated_pairs(jobs: list) -> list:
    """``jobs`` less each pair of jobs that repeats the pair just before it (the plain swaps B, A after B, A): a
    --tiny run, which checks the code, runs every kind of job and of swap, but not each of them twice in a row."""
    kept, number = [], 0
    while number < len(jobs):
        if number >= 2 and jobs[number:number + 2] == jobs[number - 2:number]:
            number += 2
            continue
        kept.append(jobs[number])
        number += 1
    return kept


def run_kept(client, tag: str, model: str, preset, outputs: Path, size: dict, **settings) -> dict:
    """``run_job``'s row, or the error it raised: one broken job must not cost the rest."""
    try:
        return run_job(client, tag, model, preset, outputs, size, **settings)
    except Exception as exc:
        return {"tag": tag, "error": repr(exc)[:400]}


def soak_swaps(out: Path, results: dict, files: dict, preset, work: Path, jobs: list) -> None:
    """``jobs`` through one engine with previews, then an unload: what it leaves allocated and its RSS."""
    from engine.service.worker import WorkerClient

    client = WorkerClient(files["models"], preview_seconds=1.0, outputs_dir=work / "outputs")
    client.start()
    try:
        results["fresh_rss_gb"] = fresh_rss(client, settle_s(results) / 2)
        for tag, model, size, settings in jobs:
            results["jobs"].append(run_kept(client, tag, model, preset, work / "outputs", size, **settings))
            save(out, results)
        client.unload()
        time.sleep(settle_s(results))
        gone = client.memory(timeout=20)
        results["unload"] = {"allocated_gb": getattr(gone, "vram_engine_gb", None),
                             "rss_gb": getattr(gone, "engine_ram_gb", None)}
        save(out, results)
    finally:
        client.close()


def small_machine(models: Path, tiny: bool) -> tuple:
    """(the hardware the engine is told, the phase hook that caps its device memory): a card of SMALL_CARD_GB in
    a 16 GB machine; the self-test model's run keeps the machine as it is."""
    from engine.service.worker import WorkerClient

    if tiny:
        return None, CapMemory(1.0)
    probe = WorkerClient(models)
    try:
        real = probe.hardware_profile()
    finally:
        probe.close()
    hardware = replace(real, device_name=f"{real.device_name} capped at {SMALL_CARD_GB:g} GB",
                       vram_total_gb=SMALL_CARD_GB, vram_free_gb=SMALL_CARD_GB, ram_total_gb=16.0,
                       ram_available_gb=14.5, devices=())
    return hardware, CapMemory(SMALL_CARD_GB / real.vram_total_gb)


def soak_small_machine(out: Path, results: dict, files: dict, preset, work: Path, tiny: bool, big: dict) -> None:
    """The small machine (``small_machine``): the disk rung, then group offload from RAM forced for its step time;
    then an unload: the pinned RAM must go back."""
    from engine.service.worker import WorkerClient

    hardware, cap = small_machine(files["models"], tiny)
    client = WorkerClient(files["models"], hardware=hardware, faults=cap, preview_seconds=-1,
                          outputs_dir=work / "outputs")
    client.start()
    try:
        results["small_machine_fresh_rss_gb"] = fresh_rss(client, settle_s(results) / 2)
        for tag, settings in (("auto (disk rung)", {} if not tiny else {"strategy": "disk_offload"}),
                              ("disk rung again", {} if not tiny else {"strategy": "disk_offload"}),
                              ("group offload from RAM (forced)", {"strategy": "group_offload"}),
                              ("group offload again", {"strategy": "group_offload"})):
            results["small_machine"].append(run_kept(client, tag, files["a"], preset, work / "outputs", big,
                                                     **settings))
            save(out, results)
        before = client.memory(timeout=20)
        client.unload()
        time.sleep(settle_s(results))
        after = client.memory(timeout=20)
        results["small_machine_unload"] = {"rss_before_gb": getattr(before, "engine_ram_gb", None),
                                           "rss_after_gb": getattr(after, "engine_ram_gb", None),
                                           "allocated_after_gb": getattr(after, "vram_engine_gb", None)}
        save(out, results)
    finally:
        client.close()


def soak_a14b(out: Path, work: Path) -> None:
    """Wan2.2 A14B (two real-size 14B experts, random weights, built in memory) under group offload on the H200
    capped at 24 GB, in this process as the engine's own: the peak, then RSS before and after the unload."""
    import psutil
    import torch

    import bench.validate_memory as vm
    from bench import realsize
    from engine.device.hardware import HardwareProfile
    from engine.models.refs import ResolvedModel
    from engine.models.spec import spec_for
    from engine.settings.presets import load_presets

    class A14B(vm.BenchEngine):
        def resolve(self, ref, job):
            return ResolvedModel(ref, self.folder, "bench", "random-weights", "WanPipeline",
                                 ("transformer", "transformer_2", "vae", "text_encoder"),
                                 spec=spec_for(ref, self.folder))

        def _from_pretrained(self, resolved, plan):
            from diffusers import UniPCMultistepScheduler, WanPipeline
            with self.uncapped():   # built on the GPU, kept in RAM: the plan (group offload) loads through RAM
                torch.manual_seed(0)
                parts = {"transformer": realsize.transformer("wan21-t2v-14b").to("cpu"),
                         "transformer_2": realsize.transformer("wan21-t2v-14b").to("cpu"),
                         "vae": realsize.vae().to("cpu"), "text_encoder": realsize.text_encoder().to("cpu")}
                dtype = getattr(torch, plan.vae_dtype)
                for part in (parts["vae"].decoder, parts["vae"].post_quant_conv, parts["vae"].encoder,
                             parts["vae"].quant_conv):
                    part.to(dtype)
            scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=12.0)
            pipe = WanPipeline(tokenizer=realsize.tokenizer(), scheduler=scheduler, boundary_ratio=0.875, **parts)
            pipe.set_progress_bar_config(disable=True)
            return pipe

    process = psutil.Process()
    total = torch.cuda.get_device_properties(0).total_memory / GIB
    budget = 24.0
    fraction = budget / total
    ram = psutil.virtual_memory()
    hardware = HardwareProfile(backend="cuda", device_name=f"H200 capped at {budget:g} GB", arch="sm_90",
                               vram_total_gb=budget, vram_free_gb=budget, ram_total_gb=round(ram.total / GIB, 1),
                               ram_available_gb=round(ram.available / GIB, 1))
    (work / "empty-model").mkdir(parents=True, exist_ok=True)
    vm.STEPS = 4   # with shift 12 the 4th step is below the boundary: both experts run
    torch.cuda.set_per_process_memory_fraction(fraction)
    engine = A14B("a14b", work / "empty-model", hardware, fraction)
    torch.zeros(1, device="cuda")   # the CUDA context, as a fresh engine process has it
    row = {"fresh_rss_gb": round(process.memory_info().rss / GIB, 2)}
    started = time.perf_counter()
    row.update(vm.run_case(engine, load_presets()["wan22-t2v-a14b-480p"], budget, work, work / "none.png"))
    row["wall_s"] = round(time.perf_counter() - started, 1)
    row["rss_before_unload_gb"] = round(process.memory_info().rss / GIB, 2)
    engine.unload()
    time.sleep(1.0)
    row["rss_after_unload_gb"] = round(process.memory_info().rss / GIB, 2)
    row["allocated_after_unload_gb"] = round(torch.cuda.memory_allocated() / GIB, 3)
    out.write_text(json.dumps({"part": "a14b", "row": row}, indent=1, default=str))
    print("A14B", json.dumps(row, default=str)[:1500], flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--part", default="models,small", help="models, small (the disk rung), a14b")
    parser.add_argument("--tiny", action="store_true", help="the self-test model on the CPU (checks the code)")
    parser.add_argument("--work", default="/tmp/wan-soak")
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    parts = tuple(args.part.split(","))
    if "a14b" in parts:
        soak_a14b(Path(args.out), work)
    else:
        soak_models(Path(args.out), work, args.tiny, parts)


if __name__ == "__main__":
    main()
