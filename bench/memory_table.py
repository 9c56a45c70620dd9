"""Turn the GPU validation runs into the table of docs/memory.md.

    python bench/memory_table.py docs/data/validation-h200-run2.json docs/data/validation-h200-run3.json

For each (budget, preset) the latest run wins. The configuration that ran is predicted again with
the memory model as it is now (its constants were refined between runs); where the planner would
now choose differently, the last column says so.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.device.hardware import HardwareProfile  # noqa: E402
from engine.models.spec import KNOWN_MODELS  # noqa: E402
from engine.planning.phases import Rung, phase_table  # noqa: E402
from engine.planning.planner import PlanRequest, plan_memory  # noqa: E402
from engine.settings.presets import load_presets  # noqa: E402


def hardware(budget: float) -> HardwareProfile:
    return HardwareProfile(backend="cuda", device_name="H200 capped", vram_total_gb=budget, vram_free_gb=budget,
                           ram_total_gb=125, ram_available_gb=118)


def size(preset) -> PlanRequest:
    return PlanRequest(preset.settings.width, preset.settings.height, preset.settings.frames, preset.settings.mode == "i2v")


def main(paths: list[str]) -> None:
    presets = load_presets()
    rows = {}
    for path in paths:
        for row in json.loads(Path(path).read_text())["rows"]:
            rows[(row["budget_gb"], row["preset"])] = row
    print("| card (GB) | preset | strategy | text encoder | VAE tiles | predicted peak GB | measured peak GB "
          "| measured / predicted | s/step | planner now |")
    print("|---|---|---|---|---|--:|--:|--:|--:|---|")
    for (budget, name), row in sorted(rows.items(), key=lambda kv: (list(presets).index(kv[0][1]), -kv[0][0])):
        preset, hw = presets[name], hardware(budget)
        spec = KNOWN_MODELS[preset.settings.model]
        now = plan_memory(spec, size(preset), hw)
        if row.get("status") != "ok":
            print(f"| {budget:g} | {name} | {row['status']} | | | {row['predicted_peak_gb']:.2f} | - | - | - | "
                  f"{now.strategy if now.fits else 'does not fit'} |")
            continue
        ran = Rung.named(row["strategy_used"], row["text_encoder"], row["vae_tile"], row["load"])
        phases = [p for p in phase_table(spec, size(preset), hw, ran)
                  if not (row.get("prompt_reused") and p.phase == "text_encode")]
        predicted = max(p.peak_vram_gb for p in phases)
        same = (now.strategy, now.text_encoder, now.vae_tile) == (ran.name, ran.text_encoder, ran.vae_tile)
        note = "same" if same else f"{now.strategy}, {now.text_encoder}, tiles {now.vae_tile or '-'}"
        measured = row["measured_peak_gb"]
        print(f"| {budget:g} | {name} | {ran.name} | {ran.text_encoder} | {ran.vae_tile or '-'} | {predicted:.2f} "
              f"| {measured:.2f} | {measured / predicted:.2f} | {row['step_s']:.2f} | {note} |")


if __name__ == "__main__":
    main(sys.argv[1:])
