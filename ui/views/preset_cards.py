"""What the Presets tab shows of each preset: its settings and what the engine expects on this machine (pure).

The hardware is the profile the engine process reported (``WorkerClient.hardware_profile()``):
the page never probes the GPU itself. An entry is plain JSON, the same for the page and the
``/presets`` API.
"""
from __future__ import annotations


from engine.device.hardware import HardwareProfile
from engine.models.catalog import ModelCatalog
from engine.planning.explain import strategy_words
from engine.planning.plan import Plan
from engine.service.ahead import plan_settings
from engine.settings.presets import Preset
from engine.words import plural
from ui.context import AppContext
from ui.views.text import plain

MODE_TITLES = {"t2v": "Text to Video", "i2v": "Image to Video"}
# Said when a plan does not fit and no change the planner knows would make it fit.
NO_WAY_OUT = "Neither fewer frames, a smaller size nor a smaller known model makes it fit on this machine."
# How a form's changes can be checked before a run.
TRY_IT = ("Press Use, change the size or frames in the form, and watch its Memory plan (under the buttons) "
          "until it fits.")


def preset_entries(ctx: AppContext, hardware: HardwareProfile | None, problem: str | None = None) -> list[dict]:
    """One entry per preset (built-ins first, then the user's own); ``problem`` says why ``hardware`` is None."""
    store = ctx.user_presets
    entries = []
    for name, preset in list(ctx.presets.items()):
        entry = preset_entry(preset, bool(store and store.is_user(name)))
        if hardware is None:
            entry["plan_problem"] = problem or "the engine process has not said what hardware it has yet"
        else:
            entry.update(expected_plan(preset, hardware, ctx.client.catalog))
        entries.append(entry)
    return entries


def preset_entry(preset: Preset, user: bool = False) -> dict:
    """The preset's settings as the card shows them (without the plan)."""
    return {
        "name": preset.name, "title": preset.title, "description": preset.description, "user": user,
        "model": preset.settings.model, "mode": preset.settings.mode, "width": preset.settings.width, "height": preset.settings.height,
        "frames": preset.settings.frames, "fps": preset.settings.fps, "seconds": round((preset.settings.frames - 1) / preset.settings.fps, 2),
        "steps": preset.settings.steps, "guidance": preset.settings.guidance, "shift": preset.settings.shift,
        "plan": None, "plan_problem": None,
    }


def expected_plan(preset: Preset, hardware: HardwareProfile, catalog: ModelCatalog) -> dict:
    """{"plan": what the engine would pick for the preset as it is, "plan_problem": None}, or why there is none."""
    try:
        plan = plan_settings(preset.settings, hardware, catalog)
    except (ValueError, OSError) as exc:   # a model whose size is unknown (ModelError), an unreadable folder
        return {"plan": None, "plan_problem": str(exc)}
    return {"plan": plan_summary(plan, hardware), "plan_problem": None}


def plan_summary(plan: Plan, hardware: HardwareProfile) -> dict:
    return {
        "strategy": plan.strategy,
        "strategy_name": strategy_words(plan.strategy, plan.device)[0],
        "strategy_text": strategy_words(plan.strategy, plan.device)[1],
        "fits": plan.fits, "device": plan.device, "machine": hardware.summary(),
        "expected_peak_vram_gb": plan.predicted_peak_vram_gb, "expected_peak_ram_gb": plan.predicted_peak_ram_gb,
        "budget_vram_gb": plan.budget_vram_gb, "budget_ram_gb": plan.budget_ram_gb,
        "text_encoder": plan.text_encoder, "vae_tile": plan.vae_tile,
        "to_make_it_fit": list(plan.suggestions),
    }


# ----- markdown ------------------------------------------------------------
def machine_markdown(entries: list[dict]) -> str:
    """The line above the cards: which machine the expectations are for, or why there are none."""
    machine = next((e["plan"]["machine"] for e in entries if e.get("plan")), None)
    if machine:
        return f"Expected memory and strategy on this machine: **{machine}** (the engine process's hardware)."
    problem = next((e["plan_problem"] for e in entries if e.get("plan_problem")), None)
    return f"Expected memory: not known yet ({problem})." if problem else ""


def card_markdown(entry: dict) -> str:
    """A preset's card: title, description, settings, and the memory the engine expects for it here."""
    mine = " · *your preset*" if entry.get("user") else ""
    lines = [f"### {plain(entry['title'])}{mine}", plain(entry["description"]), "",
             f"- **Model:** `{entry['model']}` ({MODE_TITLES.get(entry['mode'], entry['mode'])})",
             f"- **Size:** {entry['width']}x{entry['height']}, {plural(entry['frames'], 'frame')} "
             f"({entry['seconds']:.1f} s at {entry['fps']} fps)",
             f"- **Steps:** {entry['steps']}, guidance {entry['guidance']:g}, shift {entry['shift']:g}",
             *_expected_lines(entry)]
    return "\n".join(lines)


def _expected_lines(entry: dict) -> list[str]:
    plan = entry.get("plan")
    if plan is None:
        return [f"- **Expected on this machine:** unknown: {entry.get('plan_problem') or 'no plan'}"]
    ram = f"{plan['expected_peak_ram_gb']:.2f} GB RAM"
    if plan["device"] == "cpu":
        peaks = f"{ram} (CPU only: no device memory)"
    else:
        peaks = f"{plan['expected_peak_vram_gb']:.2f} GB device memory, {ram}"
    strategy = f"**{plan.get('strategy_name', plan['strategy'])}** ({plan['strategy_text']})"
    if plan["fits"]:
        return [f"- **Expected on this machine:** peak {peaks}; strategy {strategy}. Fits."]
    lines = [f"- **Does NOT fit this machine:** it needs {_shortfall(plan)}, with strategy {strategy}."]
    if not plan["to_make_it_fit"]:
        return lines + [f"  {NO_WAY_OUT}"]
    lines.append("  To make it fit:")
    lines += [f"  - {tip}" for tip in plan["to_make_it_fit"]]
    lines.append(f"  - {TRY_IT}")
    return lines


def _shortfall(plan: dict) -> str:
    """'44.27 GB RAM (26.40 GB available)' for each budget the plan exceeds."""
    parts = []
    if plan["device"] != "cpu" and plan["expected_peak_vram_gb"] > plan["budget_vram_gb"]:
        parts.append(f"{plan['expected_peak_vram_gb']:.2f} GB device memory "
                     f"({plan['budget_vram_gb']:.2f} GB available)")
    if plan["expected_peak_ram_gb"] > plan["budget_ram_gb"]:
        parts.append(f"{plan['expected_peak_ram_gb']:.2f} GB RAM ({plan['budget_ram_gb']:.2f} GB available)")
    return " and ".join(parts) or "more memory than is free"
