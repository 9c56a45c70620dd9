"""Planning settings before anything is loaded: find the model's spec, then ask the planner."""
from __future__ import annotations

from pathlib import Path

from engine.device.hardware import HardwareProfile
from engine.models.limits import Limits, check_model_limits, limits_of
from engine.models.refs import ModelError, classify_ref, hub_cache_dir
from engine.models.spec import ModelSpec, spec_for
from engine.planning.planner import Plan, plan_memory, strategy_words
from engine.settings.values import Settings


def cached_snapshot(repo_id: str) -> Path | None:
    """The newest downloaded snapshot of ``repo_id`` in the hub cache, without any network access."""
    snapshots = hub_cache_dir() / ("models--" + repo_id.replace("/", "--")) / "snapshots"
    if not snapshots.is_dir():
        return None
    candidates = [p for p in snapshots.iterdir() if (p / "model_index.json").is_file()]
    return max(candidates, key=lambda p: p.stat().st_mtime) if candidates else None


def find_spec(ref: str, models_dir: Path) -> ModelSpec:
    """The model's spec: from its files when they are here, else from the table of known models."""
    kind = classify_ref(ref)
    # A self-test model is never built here (the engine process does that): its spec is known.
    folder = {"selftest": lambda: None, "local": lambda: Path(ref).expanduser(),
              "hub": lambda: cached_snapshot(ref)}[kind]()
    spec = spec_for(ref, folder)
    if spec is None:
        raise ModelError(f"{ref} is not downloaded and not one of the known Wan models, so its size is unknown; "
                         "download it first or give a local folder")
    return spec


def limits_for(ref, models_dir: str | Path) -> Limits | None:
    """What the model ``ref`` can make, from its files (or the known models' table before a download); None
    when that is not known here (a model not downloaded yet, or a reference that cannot be used)."""
    try:
        return limits_of(find_spec(ref, Path(models_dir)))
    except (ModelError, ValueError, OSError, TypeError, KeyError):
        return None


def plan_settings(settings: Settings, hardware: HardwareProfile, models_dir: Path) -> Plan:
    """The plan for ``settings``; InputError first when the model cannot make their size or frame count."""
    spec = find_spec(settings.model, models_dir)
    check_model_limits(spec, settings.width, settings.height, settings.frames, settings.mode)
    return plan_memory(spec, settings.plan_request(), hardware, settings.override())


def plan_table(plan: Plan) -> str:
    """The plan as a readable text table (the CLI's output without --json)."""
    cpu = plan.device == "cpu"
    ram = f"{plan.predicted_peak_ram_gb:.2f} GB RAM (budget {plan.budget_ram_gb:.2f})"
    device = f"{plan.predicted_peak_vram_gb:.2f} GB device (budget {plan.budget_vram_gb:.2f}), "
    name, what = strategy_words(plan.strategy, plan.device)
    lines = [f"Strategy: {name} ({what})   "
             f"fits: {'yes' if plan.fits else 'NO'}",
             f"Predicted peak: {ram if cpu else device + ram}",
             "", f"{'phase':<12} " + ("" if cpu else f"{'device GB':>10} ") + f"{'RAM GB':>8}  where each component lives"]
    for phase in plan.phases:
        where = ", ".join(f"{k}={v}" for k, v in phase.placement.items())
        vram = "" if cpu else f"{phase.peak_vram_gb:>10.2f} "
        lines.append(f"{phase.phase:<12} {vram}{phase.peak_ram_gb:>8.2f}  {where}")
    lines += ["", "Why:"] + [f"  - {d}" for d in plan.decisions]
    if plan.suggestions:
        lines += ["", "To make it fit:"] + [f"  - {s}" for s in plan.suggestions]
    return "\n".join(lines)
