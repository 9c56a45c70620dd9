"""How near the time plan comes to what each phase takes, for every way of making a video the built-in self-test
models make here: what the page's chart says of each phase (the engine's plan of each video, summed as the chart
sums them) against what the phase took, on the very first run on a machine never measured (the run measures it and
loads the model) and on the runs after it (loaded, learning from the runs before them).

A performance claim, so it is measured here and kept in docs/ (docs/speed.md, "How near the time plan comes"), not
asserted by a test: the tests check what does not depend on this machine's pace (every phase that runs is
predicted, and a repeated run is predicted from the one before it; tests/engine/test_time_plan_ways.py).

    python -m bench.time_plan_ways OUT.json [--runs N]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from pathlib import Path
from typing import Callable

# Phases of a run that are not the run itself: never predicted (the machine measured, a self-test model built).
UNPREDICTED = frozenset({"calibrate", "build_model", "download"})
T2V, I2V = "selftest-t2v", "selftest-i2v"


def _t2v(**values) -> dict:
    return {"model": T2V, "mode": "t2v", **values}


# way -> (the runs made before it, each as request values; the way's own values given the last output and an image)
WAYS: dict[str, tuple[list[dict], Callable[[str | None, str], dict]]] = {
    "text to video": ([], lambda last, image: _t2v()),
    "a still": ([], lambda last, image: _t2v(frames=1)),
    "a long video in windows": ([], lambda last, image: _t2v(frames=57, window=33, overlap=8)),
    "several videos": ([], lambda last, image: _t2v(count=2)),
    "smoother and larger": ([], lambda last, image: _t2v(interpolate=2, upscale=2)),
    "image to video": ([], lambda last, image: dict(model=I2V, mode="i2v", image=image)),
    "extend": ([_t2v()], lambda last, image: dict(model=I2V, mode="i2v", extend=last)),
    "video to video": ([_t2v()], lambda last, image: _t2v(mode="v2v", video=last, strength=0.6)),
}
# The ways whose input is the output made before them: their own outputs are not what the next run reads.
FROM_AN_OUTPUT = ("extend", "video to video")


def request(presets, outputs: Path, values: dict, seed: int):
    """The checked request of ``values`` (model, mode and the way's own) on the self-test preset of its model."""
    from engine.settings.request import GenerationRequest, check_request

    values = dict(values)
    model = values.pop("model")
    return check_request(GenerationRequest.from_preset(presets[model], "a red fox in the snow", model=model,
                                                       outputs_dir=str(outputs), seed=seed, **values))


def chart_of(events) -> dict:
    """phase -> the seconds the page's chart said of it by the job's end (the engine's plan of each video, summed)."""
    from ui.views.job_view import JobView

    view = JobView()
    for event in events:
        view.apply(event)
    return view.predicted_so_far()


def run_way(way: str, engine, outputs: Path, image: str, presets, runs: int = 2, with_events: bool = False) -> list[dict]:
    """The way's runs on ``engine`` (after the runs it needs before it): each run's chart and what its phases took
    (and its events, ``with_events``)."""
    from engine.events import JobFinished

    before, values_of = WAYS[way]
    last, made = None, []
    for values in before:
        result = engine.run(request(presets, outputs, values, seed=1), "bench", lambda event: None, lambda: False)
        last = result.paths[0]
    for seed in range(11, 11 + runs):
        events: list = []
        result = engine.run(request(presets, outputs, values_of(last, image), seed), "bench", events.append,
                            lambda: False)
        if not isinstance(result, JobFinished):
            raise RuntimeError(f"{way}: {result}")
        took = {str(phase): seconds for phase, seconds in result.timings.items() if str(phase) not in UNPREDICTED}
        made.append(dict(predicted=chart_of(events), took=took, **({"events": events} if with_events else {})))
        if way not in FROM_AN_OUTPUT:
            last = result.paths[0]
    return made


def measure(folder: Path, runs: int) -> dict:
    """Every way on a fresh engine, with a fresh outputs folder (a machine never measured)."""
    from PIL import Image

    from engine.device.hardware import detect_hardware
    from engine.run.engine import Engine
    from engine.settings.presets import load_presets

    os.environ.setdefault("HF_HUB_OFFLINE", "1")   # the smoother's file is not fetched: its fallback runs
    presets, image, hardware = load_presets(), folder / "image.png", detect_hardware()
    Image.new("RGB", (128, 128), (200, 40, 10)).save(image)
    ways = {}
    for index, way in enumerate(WAYS):
        engine = Engine(folder / "models", hardware=hardware, preview_seconds=-1, calibrate=True)
        ways[way] = run_way(way, engine, folder / f"outputs-{index}", str(image), presets, runs)
        print(way, json.dumps(ways[way]), flush=True)
    return {"machine": platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "device": hardware.device_name, "ways": ways}


# A phase that took less than this is a cache hit or a poll's tick: its ratio says nothing.
TOO_SHORT_S = 0.005


def summary(measured: dict) -> dict:
    """way -> run -> phase -> predicted / took (the ratio the chart is off by), and "total": the whole run's."""
    ratios = {}
    for way, runs in measured["ways"].items():
        ratios[way] = []
        for run in runs:
            said, took = run["predicted"], run["took"]
            each = {phase: round(said.get(phase, 0.0) / seconds, 2) for phase, seconds in took.items()
                    if seconds >= TOO_SHORT_S}
            each["total"] = round(sum(said.values()) / sum(took.values()), 2)
            ratios[way].append(each)
    return ratios


def within(ratios: dict, low: float = 0.5, high: float = 2.0) -> dict:
    """How many of the phases (and of the runs' totals) were predicted within ``low`` to ``high`` times what they
    took, of how many, and the farthest off."""
    phases = [r for runs in ratios.values() for run in runs for p, r in run.items() if p != "total"]
    totals = [run["total"] for runs in ratios.values() for run in runs]
    worst = max(phases + totals, key=lambda r: max(r, 1 / r) if r > 0 else float("inf"))
    return {"phases_within": sum(low <= r <= high for r in phases), "phases": len(phases),
            "totals_within": sum(low <= r <= high for r in totals), "totals": len(totals), "farthest": worst}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="where the JSON results go")
    parser.add_argument("--runs", type=int, default=3, help="runs of each way after the runs it needs (default 3)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        measured = measure(Path(folder), args.runs)
    measured["predicted_over_took"] = summary(measured)
    measured["within_half_and_twice"] = within(measured["predicted_over_took"])
    Path(args.out).write_text(json.dumps(measured, indent=1), encoding="utf-8")
    for way, runs in measured["predicted_over_took"].items():
        print(f"{way:24s}", " | ".join(" ".join(f"{p}={r}" for p, r in run.items()) for run in runs))
    print(measured["within_half_and_twice"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
