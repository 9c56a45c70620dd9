"""LoRA differences on every placement: each strategy's run with a LoRA against the same changes merged by hand.

    python bench/lora_diffs_check.py OUT.json           # on the GPU: device, group and leaf offload with copy
                                                        # streams and pinned RAM, fp8 storage, Wan2.2 A14B's swap
    python bench/lora_diffs_check.py OUT.json --cpu     # the same cases on the CPU (the suite runs this)

A LoRA in lightx2v's layout (factors with an alpha, and a whole-tensor difference on every norm, bias and
modulation: tests/engine/test_lora_diffs.py makes it) goes on the tiny self-test transformers through the engine
with a forced strategy; the run's latents are compared with a run of the same strategy whose transformer file
has the LoRA merged by hand, and the next run without the LoRA with the model's own (it must be equal: every
change taken out). Offload hooks keep their own copies of each weight (pinned ones on a GPU), and the A14B swap
keeps each expert's RAM copy: only a GPU shows that the differences reach those. Nothing here asserts.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("WAN_STUDIO_CALIBRATE", "0")

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from engine.events import JobFinished  # noqa: E402
from engine.models.loras import Lora  # noqa: E402
from engine.run.engine import Engine  # noqa: E402
from engine.settings.presets import load_presets  # noqa: E402
from tests.conftest import CPU, run_engine, tiny_request  # noqa: E402
from tests.engine.test_lora_diffs import (diff_lora, expert_state, latents_of, merged_by_hand,  # noqa: E402
                                          save_transformer)
from tests.engine.test_single_file import original_state  # noqa: E402

ONE = ("all_on_device", "group_offload", "leaf_offload", "fp8_storage")
TWO = ("all_on_device", "expert_swap", "group_offload")
RUN = dict(mode="t2v", width=32, height=32, frames=5, steps=2, guidance=1.0, seed=7)


def build(work: Path) -> tuple[Path, Path]:
    """The tiny text-to-video model, and a two-expert look-alike of Wan2.2 A14B, saved as diffusers folders."""
    import copy

    from diffusers import WanPipeline

    from engine.models.selftest import SELFTEST_T2V, build_selftest_pipeline

    one = work / "tiny-t2v"
    build_selftest_pipeline(SELFTEST_T2V).save_pretrained(one)
    pipe = WanPipeline.from_pretrained(one)
    second = copy.deepcopy(pipe.transformer)
    with torch.no_grad():
        for parameter in second.parameters():
            parameter.add_(0.01 * torch.randn(parameter.shape, generator=torch.Generator().manual_seed(3)))
    two = work / "tiny-a14b"
    WanPipeline(**{**pipe.components, "transformer_2": second}, boundary_ratio=0.875).save_pretrained(two)
    return one, two


def relative(a, b) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())


def case(engine, presets, folder: Path, work: Path, strategy: str, experts: tuple[str, ...]) -> dict:
    """One strategy: the LoRA run against the hand merge, and the run after it against the model's own."""
    loras, files = [], {}
    for index, name in enumerate(experts):
        state = original_state(folder) if name == "transformer" and len(experts) == 1 else expert_state(folder, name)
        lora = diff_lora(state, seed=30 + index)
        path = work / f"{folder.name}-{name}-lora.safetensors"
        save_file(lora, str(path))
        loras.append(Lora(str(path), 0.8, "both" if len(experts) == 1 else ("high", "low")[index]))
        files["transformer" if index == 0 else "transformer_2"] = str(
            save_transformer(merged_by_hand(state, lora, 0.8), work / f"{folder.name}-{name}-merged.safetensors"))
        own_file = original_state(folder) if len(experts) == 1 else expert_state(folder, name)
        files.setdefault("own", {})["transformer" if index == 0 else "transformer_2"] = str(
            save_transformer(own_file, work / f"{folder.name}-{name}-own.safetensors"))
    outputs = work / "out"
    request = tiny_request(presets, folder, outputs, strategy=strategy, **RUN)
    own_files = files.pop("own")
    results = {}
    for label, values in (("own", {}), ("lora", {"loras": tuple(loras)}), ("after", {}), ("hand", files),
                          ("own_file", own_files)):
        result, events = run_engine(engine, request.with_values(**values))
        if not isinstance(result, JobFinished):
            return {"strategy": strategy, "failed": f"{label}: {getattr(result, 'message', result)}"}
        results[label] = latents_of(events)
        plan = next((e.plan for e in events if type(e).__name__ == "PlanReady"), None)
        if label == "lora" and plan is not None:
            results["planned"] = plan.strategy
    return {"strategy": strategy, "planned": results.get("planned"),
            "lora_vs_hand_rel": relative(results["lora"], results["hand"]),
            "lora_effect_rel": relative(results["lora"], results["own"]),
            # the floor: the model's own weights loaded from a single file, against the folder's
            "own_file_vs_own_rel": relative(results["own_file"], results["own"]),
            "lora": results["lora"],
            "after_equals_own": bool(torch.equal(results["after"], results["own"]))}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--cpu", action="store_true", help="run on the CPU (the suite's check of this script)")
    args = parser.parse_args(argv)
    if args.cpu:   # the engine's unload collects garbage 18 times: past the libraries' objects, not through them
        from bench.speed_setup import leave_libraries_out_of_collections

        leave_libraries_out_of_collections()
    work = Path(tempfile.mkdtemp(prefix="lora-diffs-"))
    one, two = build(work)
    presets = load_presets()
    engine = Engine(work / "models", CPU) if args.cpu else Engine(work / "models")
    rows = []
    try:
        for strategy in ONE:
            if args.cpu and strategy == "fp8_storage":
                continue
            rows.append({"model": "tiny-t2v", **case(engine, presets, one, work, strategy, ("transformer",))})
        for strategy in TWO:
            rows.append({"model": "tiny-a14b", **case(engine, presets, two, work, strategy,
                                                      ("transformer", "transformer_2"))})
    finally:
        engine.unload()
    for row in rows:   # every placement against the device's own run with the LoRA
        first = next(r for r in rows if r["model"] == row["model"])
        if "lora" in row and "lora" in first:
            row["lora_vs_device_rel"] = relative(row["lora"], first["lora"])
    for row in rows:
        row.pop("lora", None)
    device = "cpu" if args.cpu else torch.cuda.get_device_name(0)
    args.out.write_text(json.dumps({"device": device, "rows": rows}, indent=1))
    for row in rows:
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
