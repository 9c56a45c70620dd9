"""The load of a model as its repository stores it against the same weights stored in bf16, through the engine.

The published Wan2.1 repositories keep the transformer and the UMT5 text encoder in float32 shards with index files
(tests/fixtures/published/): a load reads twice the bytes of a bf16 folder and casts them. Three folders of the
real-size Wan2.1 T2V 1.3B with random weights (bench/realsize.py):

- ``published``: as Wan-AI/Wan2.1-T2V-1.3B-Diffusers stores it (float32 transformer in 2 shards, text encoder in 5);
- ``bf16``: the same weights in bf16 (as this project's earlier benchmarks saved them);
- ``fastwan``: as FastVideo/FastWan2.1-T2V-1.3B-Diffusers stores it (``WanDMDPipeline``, a bf16 transformer file with
  the sparse attention's gate in every block, the float32 text encoder), loaded with its gate kept.

Each folder is loaded cold (its files' pages dropped from the page cache first) and, but FastWan's, then warm, each
in a fresh process running one job through the app's Engine (the FastWan preset's 3 steps at 832x480x81): the load
and transfer phases' seconds, and the process's resident memory sampled every 20 ms during the load, whole (RSS) and
without the pages of mapped files (anonymous: what the load needs of RAM; the files' pages are the page cache's,
which the system can drop),
against the plan's predicted RAM of the load phase.

    python bench/stored_load.py OUT.json              # on a GPU
    python bench/stored_load.py OUT.json --tiny       # the same code on the CPU with the self-test model: cold
                                                      # only, the three loads in one process
    python bench/stored_load.py OUT.json --sparse     # the CPU: the published layouts' load, memory only

``--sparse`` loads the published Wan2.1 T2V 1.3B and FastWan layouts (tests/fixtures/published/, their data left as
holes, which read as zeros) through the engine's loader as a GPU plan loads them on the way to the device (bf16,
through RAM), in a fresh process each: the resident memory of the load, whole and anonymous, and what stays after
it. Its seconds say nothing (holes are read at memory speed); its memory is the load's.

Nothing asserts; the results go to OUT.json (docs/data/stored-load-*.json) and docs/models.md.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ROOT = Path(__file__).resolve().parent.parent
SIZE = dict(width=832, height=480, frames=81)
TINY_SIZE = dict(width=64, height=64, frames=9)
FOLDERS = ("published", "bf16", "fastwan")
GIB = 1024 ** 3


# ----- the folders ----------------------------------------------------------------------------------------------
def _pipeline(tiny: bool):
    if tiny:
        from engine.models.selftest import SELFTEST_T2V, build_selftest_pipeline

        return build_selftest_pipeline(SELFTEST_T2V)
    from diffusers import UniPCMultistepScheduler, WanPipeline

    from bench import realsize

    return WanPipeline(tokenizer=realsize.tokenizer(), text_encoder=realsize.text_encoder(), vae=realsize.vae(),
                       transformer=realsize.transformer("wan21-1.3b"),
                       scheduler=UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True,
                                                         flow_shift=3.0))


def build_folders(work: Path, tiny: bool) -> dict:
    """The three folders (written once) from one set of random weights, and the seconds and bytes of each; FastWan's
    shares the published folder's text encoder and VAE files (hard links: the disk holds them once)."""
    import torch

    from bench import realsize
    from engine.models.weights import weight_bytes

    shard = "40KB" if tiny else realsize.PUBLISHED_SHARD_SIZE
    made = {}
    if not all((work / name / "model_index.json").exists() for name in FOLDERS):
        torch.manual_seed(0)
        pipe = _pipeline(tiny)
        started = time.perf_counter()
        realsize.save_as_published(pipe, work / "published", "wan21", shard)
        made["published"] = time.perf_counter() - started
        started = time.perf_counter()
        pipe.transformer.to(torch.bfloat16)
        pipe.text_encoder.to(torch.bfloat16)
        pipe.save_pretrained(work / "bf16", max_shard_size=shard)
        made["bf16"] = time.perf_counter() - started
        started = time.perf_counter()
        _fastwan_folder(pipe, work / "published", work / "fastwan", shard)
        made["fastwan"] = time.perf_counter() - started
        del pipe
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    os.sync()
    return {name: {"folder": str(work / name), "write_seconds": round(made.get(name, 0.0), 1),
                   "weights_gb": round(weight_bytes(work / name) / 1e9, 2),
                   "files": sorted(p.relative_to(work / name).as_posix() for p in (work / name).rglob("*.safetensors"))}
            for name in FOLDERS}


def _fastwan_folder(pipe, published: Path, folder: Path, shard: str) -> None:
    """FastWan's layout: the published folder's other components linked, its own bf16 transformer with the gate."""
    import shutil

    import torch

    from bench import realsize

    shutil.copytree(published, folder, copy_function=os.link, ignore=shutil.ignore_patterns("transformer"))
    gated = realsize.with_gate(pipe).transformer.to(torch.bfloat16)
    gated.save_pretrained(folder / "transformer", max_shard_size=shard)
    realsize.name_as_fastwan(folder)


def drop_cached(folder: Path) -> None:
    """Drop the folder's files from the page cache (clean pages only: written and synced before)."""
    for path in Path(folder).rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


# ----- one load, in its own process ------------------------------------------------------------------------------
class Memory:
    """(seconds, RSS, shared) of this process every ``interval`` seconds, in a thread."""

    def __init__(self, interval: float = 0.02):
        self.interval, self.samples, self._stop = interval, [], threading.Event()

    def __enter__(self):
        import psutil

        process = psutil.Process()

        def sample():
            while not self._stop.is_set():
                info = process.memory_info()
                self.samples.append((time.perf_counter(), info.rss, getattr(info, "shared", 0)))
                self._stop.wait(self.interval)

        self.thread = threading.Thread(target=sample, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self.thread.join()

    def peaks(self, start: float, end: float) -> dict:
        """The highest RSS and anonymous memory sampled from ``start`` to ``end``; when no sample fell inside (a load
        shorter than the interval, or one the sampling thread was not scheduled during on a busy machine: 0 GB
        before), the samples just before and just after it."""
        inside = [sample for sample in self.samples if start <= sample[0] <= end]
        if not inside:
            inside = [sample for sample in self.samples if sample[0] < start][-1:] + \
                     [sample for sample in self.samples if sample[0] > end][:1]
        inside = [(rss, rss - shared) for _, rss, shared in inside] or [(0, 0)]
        return {"rss_gb": round(max(r for r, _ in inside) / GIB, 2), "anon_gb": round(max(a for _, a in inside) / GIB, 2)}


def child(folder: str, out: str, tiny: bool) -> None:
    from engine.device.hardware import detect_hardware
    from engine.events import JobFinished, PhaseFinished, PhaseStarted
    from engine.run.engine import Engine
    from engine.settings.presets import load_presets
    from engine.settings.request import GenerationRequest

    work = Path(out).parent
    preset = load_presets()["fastwan21-t2v-1.3b"]
    request = GenerationRequest.from_preset(preset, "a red fox running through snow", model=folder, seed=1,
                                            outputs_dir=str(work / "outputs"), **(TINY_SIZE if tiny else SIZE))
    engine = Engine(work / "models", detect_hardware())
    times: dict = {}
    held: dict = {}

    def emit(event):
        if isinstance(event, (PhaseStarted, PhaseFinished)):
            times[(str(event.phase), isinstance(event, PhaseStarted))] = time.perf_counter()
        if isinstance(event, PhaseFinished) and str(event.phase) in ("load", "transfer"):
            import psutil

            info = psutil.Process().memory_info()
            held[f"after_{event.phase}"] = {"rss_gb": round(info.rss / GIB, 2),
                                            "anon_gb": round((info.rss - getattr(info, "shared", 0)) / GIB, 2)}

    with Memory() as memory:
        result = engine.run(request, "bench", emit)
    if not isinstance(result, JobFinished):
        Path(out).write_text(json.dumps({"failed": getattr(result, "message", str(result))}))
        return
    sidecar = json.loads(Path(result.sidecar).read_text())
    plan = sidecar["plan"]
    load = memory.peaks(times[("load", True)], times[("load", False)])
    transfer = memory.peaks(times[("transfer", True)], times[("transfer", False)])
    record = {
        "strategy": plan["strategy"], "load_route": plan.get("load"), "timings": sidecar["timings"],
        "load": load, "transfer": transfer, **held,
        "predicted_load_ram_gb": plan["phases"]["load"]["peak_ram_gb"],
        "predicted_peak_ram_gb": plan["predicted_peak_ram_gb"],
        "peak_ram_gb": sidecar["peak_ram_gb"], "peak_vram_gb": sidecar["peak_vram_gb"],
        "transformer": type(engine.loaded.pipe.transformer).__name__,
        "gate_layers": sum(1 for name, _ in engine.loaded.pipe.transformer.named_modules()
                           if name.endswith("to_gate_compress")),
    }
    engine.unload()
    Path(out).write_text(json.dumps(record))


# ----- the published layouts' load on the CPU (--sparse) ------------------------------------------------------------
SPARSE = ("Wan-AI/Wan2.1-T2V-1.3B-Diffusers", "FastVideo/FastWan2.1-T2V-1.3B-Diffusers")
# A GPU's plan for them (bf16, loaded through RAM), for a load measured on the CPU.
PLANNED_ON = dict(backend="cuda", device_name="a 24 GB GPU", vram_total_gb=24, vram_free_gb=23.2, ram_total_gb=64,
                  ram_available_gb=58)


def sparse_folder(repo: str, work: Path) -> Path:
    """The published layout at its sizes (holes for data), with a tokenizer that reads (the self-test model's)."""
    import shutil

    from engine.models.selftest import _tokenizer
    from tests.layouts import materialize_repo

    folder = work / repo.replace("/", "--")
    if not (folder / "model_index.json").exists():
        materialize_repo(repo, folder)
        shutil.rmtree(folder / "tokenizer")
        _tokenizer().save_pretrained(folder / "tokenizer")
    return folder


def sparse_child(folder: str, out: str) -> None:
    from engine.device.hardware import HardwareProfile
    from engine.models.catalog import ModelCatalog
    from engine.run.engine import Engine
    from engine.settings.presets import load_presets
    from engine.settings.request import GenerationRequest

    preset = load_presets()["fastwan21-t2v-1.3b"]
    request = GenerationRequest.from_preset(preset, "a fox", model=folder, outputs_dir=str(Path(out).parent))
    hardware = HardwareProfile(**PLANNED_ON)
    engine = Engine(Path(out).parent / "models", hardware)
    resolved = ModelCatalog().resolve(folder, engine.models_dir)
    plan = engine.plan_for(request, resolved.spec)
    started = time.perf_counter()
    with Memory() as memory:
        pipe = engine._from_pretrained(resolved, plan)
        ended = time.perf_counter()
    import psutil

    info = psutil.Process().memory_info()
    load = next(phase for phase in plan.phases if phase.phase == "load")
    Path(out).write_text(json.dumps({
        "plan": {"strategy": plan.strategy, "dtype": plan.dtype, "load": plan.load},
        "load": memory.peaks(started, ended),
        "after_load": {"rss_gb": round(info.rss / GIB, 2), "anon_gb": round((info.rss - info.shared) / GIB, 2)},
        "predicted_load_ram_gb": load.peak_ram_gb, "predicted_mapped_gb": load.mapped_gb,
        "weights_gb": round(sum(p.numel() * p.element_size() for c in pipe.components.values()
                                if hasattr(c, "parameters") for p in c.parameters()) / GIB, 2),
        "transformer": type(pipe.transformer).__name__}))


def run_sparse(out: Path, work: Path) -> dict:
    """Each published layout's load in a fresh process (sparse_child)."""
    results = {"planned_on": PLANNED_ON, "loads": {}}
    for repo in SPARSE:
        folder = sparse_folder(repo, work)
        result = work / f"{folder.name}.json"
        done = subprocess.run([sys.executable, __file__, "--sparse-child", str(folder), str(result)], cwd=ROOT,
                              capture_output=True, text=True, timeout=1800)
        results["loads"][repo] = json.loads(result.read_text()) if done.returncode == 0 else {
            "failed": done.stderr[-3000:]}
        print(repo, json.dumps(results["loads"][repo])[:600], flush=True)
        out.write_text(json.dumps(results, indent=1))
    return results


def run_child(loads: list[tuple[Path, Path]], tiny: bool) -> list[dict]:
    """Each (folder, result file) of ``loads`` loaded in one fresh process, one after another: their records."""
    args = [sys.executable, __file__, "--child", *(str(path) for load in loads for path in load)]
    env = {**os.environ, "WAN_STUDIO_CALIBRATE": "0"}   # the load is measured, not the machine's rates
    done = subprocess.run(args + (["--tiny"] if tiny else []), cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900)
    if done.returncode != 0:
        return [{"failed": done.stderr[-3000:]} for _ in loads]
    return [json.loads(out.read_text()) for _, out in loads]


def run_loads(work: Path, out: Path, results: dict, tiny: bool) -> None:
    """Each folder loaded cold (its pages dropped first) and, but FastWan's, then warm, in a fresh process each.
    --tiny, which checks the code on the CPU, loads each folder once (a warm load runs the same child as a cold
    one, with the pages left cached), the three in one process: one start of the libraries, not three."""
    runs = [(name, state) for name in FOLDERS for state in (("cold", "warm") if name != "fastwan" and not tiny
                                                            else ("cold",))]
    for batch in [runs] if tiny else [[run] for run in runs]:
        for name, state in batch:
            if state == "cold":
                drop_cached(work / name)
        records = run_child([(work / name, work / f"{name}-{state}.json") for name, state in batch], tiny)
        for (name, state), record in zip(batch, records):
            results.setdefault("loads", {}).setdefault(name, {})[state] = record
            out.write_text(json.dumps(results, indent=1))
            print(name, state, json.dumps(record)[:400], flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="?")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--work", default=None, help="where the folders go (default: a temporary folder)")
    parser.add_argument("--sparse", action="store_true", help="the published layouts' load on the CPU, memory only")
    parser.add_argument("--child", nargs="+", metavar="FOLDER RESULT", help=argparse.SUPPRESS)
    parser.add_argument("--sparse-child", nargs=2, metavar=("FOLDER", "RESULT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        if args.tiny:   # the engine's unload after each load: past the libraries' objects
            from bench.speed_setup import leave_libraries_out_of_collections

            leave_libraries_out_of_collections()
        for folder, result in zip(args.child[::2], args.child[1::2]):
            child(folder, result, args.tiny)
        return
    if args.sparse_child:
        return sparse_child(*args.sparse_child)
    if not args.out:
        parser.error("OUT is needed")
    work = Path(args.work or tempfile.mkdtemp(prefix="stored-load-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.sparse:
        run_sparse(Path(args.out), work)
        return
    results: dict = {"model": "Wan2.1 T2V 1.3B real-size, random weights" if not args.tiny else "selftest-t2v",
                     "size": TINY_SIZE if args.tiny else SIZE}
    results["folders"] = build_folders(work, args.tiny)
    if args.tiny:   # past the libraries' objects at the exit
        from bench.speed_setup import leave_libraries_out_of_collections

        leave_libraries_out_of_collections(engine=False)
    run_loads(work, Path(args.out), results, args.tiny)
    Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
