"""Planning settings before anything is loaded: find the model's spec (the catalog reads its files), then ask
the planner, which is pure (engine/planning/)."""
from __future__ import annotations

from dataclasses import replace

from engine.device.hardware import HardwareProfile
from engine.models.catalog import ModelCatalog
from engine.settings.model_fit import check_model_fits
from engine.planning.explain import strategy_words
from engine.planning.plan import Plan
from engine.planning.planner import gpus_for, override_for, plan_memory, plan_request_for
from engine.planning.speed import speed_line
from engine.settings.values import Settings


def plan_settings(settings: Settings, hardware: HardwareProfile, catalog: ModelCatalog,
                  engines: int | None = None) -> Plan:
    """The plan for ``settings`` on as many GPUs as the job would use (``gpus_for``, with the app's ``engines``
    when known; the sentence why comes first among the plan's reasons on a machine with several, or when the
    settings ask); InputError first when the model cannot make what they ask (its kind, size, frame count or
    experts), or a single transformer file does not fit the model."""
    info = catalog.info(settings)
    check_model_fits(info, settings, last_image=None)
    spec = info.spec
    ranks, why = gpus_for(settings, spec, hardware, engines)
    plan = plan_memory(spec, replace(plan_request_for(settings), ranks=ranks), hardware, override_for(settings))
    if (hardware.gpu_count if engines is None else engines) > 1 or settings.gpus:
        plan = replace(plan, decisions=(f"GPUs: {why}", *plan.decisions))
    return plan


def plan_table(plan: Plan) -> str:
    """The plan as a readable text table (the CLI's output without --json)."""
    cpu = plan.device == "cpu"
    ram = f"{plan.predicted_peak_ram_gb:.2f} GB RAM (budget {plan.budget_ram_gb:.2f})"
    device = f"{plan.predicted_peak_vram_gb:.2f} GB device (budget {plan.budget_vram_gb:.2f}), "
    name, what = strategy_words(plan.strategy, plan.device)
    lines = [f"Strategy: {name} ({what})   "
             f"fits: {'yes' if plan.fits else 'NO'}",
             f"Predicted peak: {ram if cpu else device + ram}",
             f"Speed: {speed_line(plan)}",
             *([f"GPUs: {plan.split.ranks}, split ({plan.split.kind or 'not possible'}): {plan.split.reason}"]
               if plan.split else []),
             "", f"{'phase':<12} " + ("" if cpu else f"{'device GB':>10} ") + f"{'RAM GB':>8}  where each component lives"]
    for phase in plan.phases:
        where = ", ".join(f"{k}={v}" for k, v in phase.placement.items())
        vram = "" if cpu else f"{phase.peak_vram_gb:>10.2f} "
        lines.append(f"{phase.phase:<12} {vram}{phase.peak_ram_gb:>8.2f}  {where}")
    lines += ["", "Why:"] + [f"  - {d}" for d in plan.decisions]
    if plan.suggestions:
        lines += ["", "To make it fit:"] + [f"  - {s}" for s in plan.suggestions]
    return "\n".join(lines)


def predicted_job(settings: Settings, plan: Plan, hardware: HardwareProfile, catalog: ModelCatalog, outputs_dir,
                  models_dir, extends: bool = False):
    """The whole job's predicted time (engine/planning/job_time.py's JobTime) from this machine's measured rates and
    the runs the engine kept beside the outputs, as the engine will predict it; None before the machine has been
    measured (its first run measures it) or when the plan does not fit."""
    from pathlib import Path

    from engine.device.calibrate import Calibration
    from engine.run.time_plan import kept_runs, post_files, whole_job

    calibration = Calibration.load(Path(outputs_dir), hardware)
    if calibration is None or not plan.fits:
        return None
    return whole_job(catalog.info(settings).spec, settings.model, settings, plan, calibration,
                     kept_runs(outputs_dir, calibration), post_files(models_dir), extends)
