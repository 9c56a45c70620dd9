"""The tables of docs/speed.md, from bench/speed.py's JSON results (pure reading; no GPU needed).

    python bench/speed.py --table docs/data/speed-1.3b-h200.json docs/data/speed-caches-h200.json

Besides printing what was measured, it predicts every warm engine run again with the time plan's model
(engine/planning/timing.py) from the calibration recorded in the same run, so the table shows how close the
prediction made *before* a run (from this machine's rates alone, nothing learned) comes to what it took.
"""
from __future__ import annotations

import json
from pathlib import Path

ONE_3B = "Wan-AI/Wan2.1-T2V-1.3B-Diffusers"
PHASES = ("load", "transfer", "text_encode", "denoise", "vae_decode", "export")


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def _s(value) -> str:
    return "-" if value is None else f"{value:.2f}"


def tables(paths: list[Path]) -> str:
    data = {}
    for path in paths:   # the first file's machine facts and calibration stand (a later run's has learned more)
        for key, value in json.loads(Path(path).read_text()).items():
            data.setdefault(key, value)
    size = f"; {'x'.join(str(n) for n in data['size'])} (width x height x frames)" if "warm" in data else ""
    out = [f"Machine: {data.get('machine')}, torch {data.get('torch')}, diffusers {data.get('diffusers')}, "
           f"{data.get('date')}{size}."]
    if "cold" in data:
        out += ["", _cold(data["cold"])]
    if "warm" in data:
        out += ["", _warm(data["warm"])]
    if "decode" in data:
        out += ["", _decode(data["decode"])]
    if "caches" in data:
        out += ["", _caches(data["caches"])]
    if "attention" in data:
        out += ["", _attention(data["attention"])]
    for key in ("14b", "5b"):
        if key in data:
            out += ["", _in_memory(key, data[key])]
    if "warm" in data and "calibration" in data:
        out += ["", _predicted(data)]
    rows = [(case, row) for case, runs in _engine_runs(data) for row in runs if row.get("predicted")]
    if rows:
        out += ["", _engine_predicted(rows)]
    return "\n".join(out)


def _engine_runs(data: dict):
    """(case name, the engine's rows) of every warm case in ``data``."""
    for case in ("fastwan", "long"):
        if case in data.get("warm", {}):
            yield case, data["warm"][case]["engine"]
    for key in ("14b", "5b"):
        if key in data:
            yield f"{key} {data[key]['preset']}", data[key].get("engine", [])


def _in_memory(key: str, result: dict) -> str:
    """A model built in memory (the 14B and 5B): plain diffusers against the engine, model loaded."""
    plain = result.get("plain", [])
    base = min((r["seconds"] for r in plain), default=None)
    title = f"{result['preset']} at {'x'.join(str(n) for n in _size(result))}, {result['steps']} steps"
    lines = ["| case | side | request to mp4, s | step, s | VAE decode, s | export (after the last frame), s "
             "| peak VRAM GiB | latents vs plain (max abs) | time / plain |",
             "|---|---|--:|--:|--:|--:|--:|--:|--:|"]
    for row in plain:
        lines.append(f"| {title} | diffusers, run {row['run']} | {_s(row['seconds'])} | {row['step_s']:.3f} | "
                     f"{_s(row['decode_s'])} | {_s(row['export_s'])} | {_s(row['peak_vram_gb'])} | - | "
                     f"{_ratio(row['seconds'], base)} |")
    for row in result.get("engine", []):
        first = " (model load)" if "load" in row["timings"] else ""
        diff = row.get("latents_vs_plain")
        diff = "identical" if diff == 0 else f"{diff:.3f}"
        lines.append(f"| {title} | engine, run {row['run']}{first} | {_s(row['seconds'])} | {row['step_s']:.3f} | "
                     f"{_s(row['timings'].get('vae_decode'))} | {_s(row['timings'].get('export'))} | "
                     f"{_s(row['peak_vram_gb'])} | {diff} | {_ratio(row['seconds'], base)} |")
    return "\n".join(lines)


def _size(result: dict) -> tuple:
    """A model built in memory runs at its preset's size (recorded since; read from the preset before)."""
    if "size" in result:
        return tuple(result["size"])
    from engine.settings.presets import load_presets

    settings = load_presets()[result["preset"]].settings
    return settings.width, settings.height, settings.frames


def _engine_predicted(rows: list) -> str:
    """What the engine itself told the page before each run (calibration and what it learned from the runs
    before), against what the run took."""
    shown = [p for p in PHASES if p != "load"]
    lines = ["| case, run | " + " | ".join(f"{p} (said / took)" for p in shown) + " |",
             "|---|" + "--:|" * len(shown)]
    worst = []
    for case, row in rows:
        cells = []
        for phase in shown:
            took, said = row["timings"].get(phase), row["predicted"].get(phase)
            cells.append("-" if took is None or said is None else f"{said:.2f} / {took:.2f}")
            if took and said and took > 0.3:
                worst.append((abs(said / took - 1), f"{case} {row.get('variant', row.get('run'))} {phase}"))
        lines.append(f"| {case}, {row.get('variant', row.get('run'))} | " + " | ".join(cells) + " |")
    if worst:
        error, where = max(worst)
        within = sum(e <= 0.25 for e, _ in worst)
        lines.append(f"\nPhases over 0.3 s within 25% of what the engine said: {within} of {len(worst)}; "
                     f"the largest miss {100 * error:.0f}% ({where}).")
    return "\n".join(lines)


def _cold(cold: dict) -> str:
    best = cold["best"]
    return ("| cold start, process start to mp4 on disk (" + str(cold["steps"]) + " steps) | plain diffusers | "
            "engine (`app.py generate`) | engine / plain |\n|---|--:|--:|--:|\n"
            f"| seconds | {_s(best.get('plain'))} | {_s(best.get('engine'))} | "
            f"{_ratio(best.get('engine'), best.get('plain'))} |")


def _warm(warm: dict) -> str:
    lines = ["| case | side, variant | request to mp4, s | step, s | VAE decode, s | export (after the last frame), s "
             "| peak VRAM GiB | latents vs plain (max abs) | time / plain |",
             "|---|---|--:|--:|--:|--:|--:|--:|--:|"]
    for case in ("fastwan", "long"):
        if case not in warm:
            continue
        plain = warm[case]["plain"]
        base = min(r["seconds"] for r in plain)
        title = "FastWan preset (3 steps, no guidance)" if case == "fastwan" else "1.3B, 50 steps, guidance 5"
        for row in plain:
            lines.append(f"| {title} | diffusers, prompt {row['prompt']} | {_s(row['seconds'])} | {row['step_s']:.3f} | "
                         f"{_s(row['decode_s'])} | {_s(row['export_s'])} | {_s(row['peak_vram_gb'])} | - | "
                         f"{_ratio(row['seconds'], base)} |")
        for row in warm[case]["engine"]:
            first = " (model load)" if "load" in row["timings"] else ""
            diff = "-" if row["latents_vs_plain"] is None else ("identical" if row["latents_vs_plain"] == 0
                                                                 else f"{row['latents_vs_plain']:.3f}")
            lines.append(f"| {title} | engine, {row['variant']}{first} | {_s(row['seconds'])} | {row['step_s']:.3f} | "
                         f"{_s(row['timings'].get('vae_decode'))} | {_s(row['timings'].get('export'))} | "
                         f"{_s(row['peak_vram_gb'])} | {diff} | {_ratio(row['seconds'], base)} |")
    return "\n".join(lines)


def _decode(decode: dict) -> str:
    lines = ["| the same latents decoded (81 frames) | s | peak VRAM GiB |", "|---|--:|--:|"]
    for name, row in decode.items():
        if isinstance(row, dict) and "seconds" in row:
            lines.append(f"| {name} | {row['seconds']:.3f} | {_s(row['peak_vram_gb'])} |")
    frames = decode.get("bfloat16 vs float32 frames")
    if frames:
        lines.append(f"\nbfloat16 frames against float32 (uint8 levels): largest difference {frames['max']}, mean "
                     f"{frames['mean']}, {100 * frames['within_2']:.2f}% within 2 levels; streamed frames equal "
                     f"the whole decode's: {decode.get('streamed equals whole')}.")
    return "\n".join(lines)


def _caches(caches: dict) -> str:
    none = caches["none"]
    lines = [f"| step cache ({none['plan'] and ''}20 steps, guidance 5) | denoise, s | speed-up | latents vs uncached "
             "(max abs) |", "|---|--:|--:|--:|",
             f"| none | {none['timings']['denoise']:.2f} | 1.00x | - |"]
    for name, row in caches.items():
        if name != "none":
            lines.append(f"| {name} | {row['timings']['denoise']:.2f} | {row['speedup']:.2f}x | "
                         f"{row['latents_vs_uncached']} |")
    return "\n".join(lines)


def _attention(attention: dict) -> str:
    names = sorted({name for row in attention.values() for name in row})
    lines = ["| self-attention call | " + " | ".join(names) + " |", "|---|" + "--:|" * len(names)]
    for shape, row in attention.items():
        lines.append(f"| {shape} | " + " | ".join(f"{1000 * row[n]:.1f} ms" if n in row else "-" for n in names) + " |")
    return "\n".join(lines)


def _predicted(data: dict) -> str:
    """Each warm engine run predicted again from the recorded calibration alone, against what it took."""
    from engine.device.calibrate import Calibration
    from engine.device.hardware import HardwareProfile
    from engine.models.spec import KNOWN_MODELS
    from engine.planning.planner import Override, PlanRequest, plan_memory
    from engine.planning.speed import SpeedRequest
    from engine.planning.timing import predict_times

    calibration = Calibration.from_dict({k: v for k, v in data["calibration"].items() if k != "seconds"})
    hw = HardwareProfile(backend="cuda", device_name=data["machine"], arch="sm_90", vram_total_gb=139.8,
                         vram_free_gb=139.0, ram_total_gb=128.0, ram_available_gb=120.0, triton=True,
                         torchao=True)
    spec = KNOWN_MODELS[ONE_3B]
    width, height, frames = data["size"]
    steps = {"fastwan": (3, 1.0), "long": (50, 5.0)}
    lines = ["| case, variant | " + " | ".join(f"{p} (predicted / took)" for p in PHASES) + " | total |",
             "|---|" + "--:|" * (len(PHASES) + 1)]
    compiled_before = False
    worst = []
    for case in (c for c in ("fastwan", "long") if c in data["warm"]):   # a run may measure one case only
        count, guidance = steps[case]
        for row in data["warm"][case]["engine"]:
            compiled, speed = row["plan"]["compile"], row.get("speed") or {}
            decoder = (speed.get("decoder") or ("fast" if "fast decoder" in row["variant"] else "vae")).split()[0]
            request = PlanRequest(width, height, frames, speed=SpeedRequest(count, guidance),
                                  decoder=decoder, compute=speed.get("compute") or "exact")
            plan = plan_memory(spec, request, hw, Override(compile=compiled,
                                                           guidance_batch=row["plan"].get("guidance_batch")))
            loaded = "load" not in row["timings"]
            guess = predict_times(spec, width, height, frames, count, guidance, plan, calibration,
                                  decoder, loaded=loaded,
                                  compiled=compiled and compiled_before)
            compiled_before = compiled_before or compiled
            cells = []
            for phase in PHASES:
                took, said = row["timings"].get(phase), guess.seconds.get(phase)
                cells.append("-" if took is None or said is None else f"{said:.2f} / {took:.2f}")
                if took and said and phase not in ("load",) and took > 0.3:
                    worst.append((abs(said / took - 1), f"{case} {row['variant']} {phase}"))
            took_total = sum(row["timings"].get(p, 0.0) for p in PHASES)
            lines.append(f"| {case}, {row['variant']} | " + " | ".join(cells) +
                         f" | {guess.total:.1f} / {took_total:.1f} |")
    if worst:
        error, where = max(worst)
        lines.append(f"\nLargest miss among phases over 0.3 s (the load aside): {100 * error:.0f}% ({where}).")
    return "\n".join(lines)
