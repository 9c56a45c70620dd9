"""docs/memory.md's soak tables from bench/memory_soak.py's output.

    python bench/soak_table.py docs/data/memory-soak-h200.json [docs/data/memory-soak-a14b-h200.json]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def _cell(value, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def table(results: dict) -> str:
    """One row per job: what it ran, the device peak, what stayed allocated, the engine's RSS, the step time."""
    lines = ["| job | strategy | loaded | peak allocated GiB | allocated after GiB | engine RSS after GiB | step s | "
             "LoRAs | compiled |", "|---|---|---|---|---|---|---|---|---|"]
    for job in results.get("jobs", []) + results.get("small_machine", []):
        if "error" in job or job.get("ended") != "JobFinished":
            lines.append(f"| {job['tag']} | failed: {job.get('error') or job.get('message')} |||||||")
            continue
        lines.append(f"| {job['tag']} | {job['strategy']} | {'yes' if job['loaded'] else 'no'} | "
                     f"{_cell(job['peak_vram_gb'])} | {_cell(job['allocated_after_gb'])} | {_cell(job['rss_after_gb'])} | "
                     f"{_cell(job['step_s'], 3)} | {job['loras'] or '-'} | {'yes' if job['compiled'] else 'no'} |")
    return "\n".join(lines)


def targets(results: dict) -> dict:
    """The issue's targets, read off the jobs: the swap peak against the model's own first peak at that size, what
    stays allocated after each job against the first job of the same model and plan, RSS after the unloads against
    a fresh engine's, each LoRA's step time against the same run without, the disk rung's step against group
    offload's."""
    jobs = [j for j in results.get("jobs", []) if j.get("ended") == "JobFinished"]
    said: dict = {}
    by_tag = {}
    for job in jobs:
        by_tag.setdefault(job["tag"], job)
    own = {"small": (by_tag.get("A") or {}).get("peak_vram_gb"), "big": (by_tag.get("A big") or {}).get("peak_vram_gb")}
    ratios = [job["peak_vram_gb"] / own["big" if "big" in job["tag"] else "small"] for job in jobs
              if "swap" in job["tag"] and not job["settings"] and own["big" if "big" in job["tag"] else "small"]]
    if ratios:
        said["swap peak / the model's own first peak (largest)"] = round(max(ratios), 3)
    levels: dict = {}
    spread = []
    for job in jobs:
        key = (job["model"], job["strategy"], bool(job["settings"].get("transformer")))
        if job["allocated_after_gb"] is None:
            continue
        level = levels.setdefault(key, job["allocated_after_gb"])
        spread.append(abs(job["allocated_after_gb"] - level))
    if spread:
        said["allocated after, largest difference from the model's level GiB"] = round(max(spread), 3)
    fresh = results.get("fresh_rss_gb")
    if fresh and results.get("unload", {}).get("rss_gb") is not None:
        said["RSS after unload - fresh engine GiB"] = round(results["unload"]["rss_gb"] - fresh, 2)
    small_fresh, small = results.get("small_machine_fresh_rss_gb"), results.get("small_machine_unload") or {}
    if small_fresh and small.get("rss_after_gb") is not None:
        said["small machine: RSS before unload GiB"] = small.get("rss_before_gb")
        said["small machine: RSS after unload - fresh engine GiB"] = round(small["rss_after_gb"] - small_fresh, 2)
    for lora, plain in (("A big lora 1.0 again", "A big"), ("A big lora 0.5", "A big no lora"),
                        ("A big compiled lora 1.0", "A big compiled again"),
                        ("A big compiled lora 0.5", "A big compiled no lora"), ("A gguf lora 1.0", "A gguf again")):
        if lora in by_tag and plain in by_tag and by_tag[plain]["step_s"]:
            said[f"step {lora} / {plain}"] = round(by_tag[lora]["step_s"] / by_tag[plain]["step_s"], 3)
    small_jobs = {j["tag"]: j for j in results.get("small_machine", []) if j.get("ended") == "JobFinished"}
    if "disk rung again" in small_jobs and "group offload again" in small_jobs:
        said["disk rung step / group offload step"] = round(
            small_jobs["disk rung again"]["step_s"] / small_jobs["group offload again"]["step_s"], 2)
    return said


def main() -> None:
    for path in sys.argv[1:]:
        results = json.loads(Path(path).read_text())
        if results.get("part") == "a14b":
            print(json.dumps(results["row"], indent=1))
            continue
        print(table(results))
        print()
        for name, value in targets(results).items():
            print(f"- {name}: {value}")


if __name__ == "__main__":
    main()
