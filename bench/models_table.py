"""The memory tables of docs/models.md: every model and size the app knows, planned on six machines.

    python bench/models_table.py                      # print the tables
    python bench/models_table.py --doc docs/models.md # write them between the doc's markers

Pure: the planner (engine/planning/planner.py) with the known models' shapes (engine/models/spec.py) and
hardware profiles written here; no torch, no files but the presets. The rows are the built-in presets (the
self-test ones aside), the Wan models' usual sizes, and Wan2.1 T2V 14B from a GGUF file, its size modelled from
the quantisation's bits per weight. A change to the planner changes the tables: write them again.
"""
from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.device.hardware import HardwareProfile  # noqa: E402
from engine.models.spec import KNOWN_MODELS, ModelSpec, TransformerWeights  # noqa: E402
from engine.planning.planner import Plan, PlanRequest, plan_memory  # noqa: E402
from engine.settings.presets import load_presets  # noqa: E402

BEGIN, END = "<!-- models_table: begin -->", "<!-- models_table: end -->"

# Free memory as a running desktop leaves it: a little of the card taken by the display, a quarter to a fifth of
# the RAM by the system and the browser.
PROFILES = {
    "8 GB laptop GPU (RTX 4060 Laptop), 16 GB RAM": HardwareProfile(
        backend="cuda", device_name="RTX 4060 Laptop", arch="sm_89", vram_total_gb=8, vram_free_gb=7.4,
        ram_total_gb=16, ram_available_gb=12, os="windows"),
    "8 GB laptop GPU (RTX 4060 Laptop), 32 GB RAM": HardwareProfile(
        backend="cuda", device_name="RTX 4060 Laptop", arch="sm_89", vram_total_gb=8, vram_free_gb=7.4,
        ram_total_gb=32, ram_available_gb=26, os="windows"),
    "12 GB GPU (RTX 3060 / 4070), 32 GB RAM": HardwareProfile(
        backend="cuda", device_name="RTX 3060", arch="sm_86", vram_total_gb=12, vram_free_gb=11.3,
        ram_total_gb=32, ram_available_gb=27, os="windows"),
    "24 GB GPU (RTX 4090), 64 GB RAM": HardwareProfile(
        backend="cuda", device_name="RTX 4090", arch="sm_89", vram_total_gb=24, vram_free_gb=23.2,
        ram_total_gb=64, ram_available_gb=58),
    "Strix Halo, 128 GB unified (96 GB to the GPU)": HardwareProfile(
        backend="rocm", device_name="AMD Radeon 8060S", arch="gfx1151", vram_total_gb=96, vram_free_gb=95,
        ram_total_gb=32, ram_available_gb=26, unified_memory=True),
    "Mac M-series, 64 GB unified": HardwareProfile(
        backend="mps", device_name="Apple M-series", arch="apple", vram_total_gb=64, vram_free_gb=50,
        ram_total_gb=64, ram_available_gb=50, unified_memory=True, os="macos"),
    "H200 (141 GB), 128 GB RAM": HardwareProfile(
        backend="cuda", device_name="NVIDIA H200", arch="sm_90", vram_total_gb=139.8, vram_free_gb=139,
        ram_total_gb=128, ram_available_gb=120),
}

T2V_14B = "Wan-AI/Wan2.1-T2V-14B-Diffusers"
I2V_14B_720P = "Wan-AI/Wan2.1-I2V-14B-720P-Diffusers"
FLF2V_14B = "Wan-AI/Wan2.1-FLF2V-14B-720P-diffusers"   # the Hub repo's own spelling
T2V_A14B = "Wan-AI/Wan2.2-T2V-A14B-Diffusers"
I2V_A14B = "Wan-AI/Wan2.2-I2V-A14B-Diffusers"
# (model, width, height, frames, from an image) beyond the presets' own.
SIZES = (
    (T2V_14B, 832, 480, 81, False), (T2V_14B, 1280, 720, 81, False),
    (I2V_14B_720P, 1280, 720, 81, True), (FLF2V_14B, 1280, 720, 81, True),
    (T2V_A14B, 1280, 720, 81, False), (T2V_A14B, 832, 480, 81, False),
    (I2V_A14B, 1280, 720, 81, True), (I2V_A14B, 832, 480, 81, True),
)
# GGUF files of Wan2.1 T2V 14B: (type, bits per weight as stored). Q8_0 keeps 32 weights in 34 bytes, Q4_K
# 256 in 144; the converters leave about 0.5% of the weights (norms, biases, modulation) unquantised.
GGUF_TYPES = (("Q8_0", 8.5), ("Q4_K", 4.5))
GGUF_QUANTISED_SHARE = 0.995
GGUF_SIZES = ((832, 480, 81), (1280, 720, 81))


@dataclass(frozen=True)
class Row:
    title: str        # what the table is headed with
    spec: ModelSpec
    request: PlanRequest
    note: str = ""


def gguf_spec(ref: str, quantization: str, bits: float) -> ModelSpec:
    """``ref``'s spec with each transformer from a GGUF file of ``quantization`` (sizes modelled, no file read)."""
    spec = KNOWN_MODELS[ref]
    params = spec.transformer.params
    quantised = int(params * GGUF_QUANTISED_SHARE)
    name = ref.split("/")[-1].removesuffix("-Diffusers").lower()
    file = TransformerWeights((f"models/transformers/{name}-{quantization}.gguf", 0, 0), quantization, params,
                              quantised, int(quantised * bits / 8))
    return replace(spec, transformer_files=(file,) * spec.experts)


def _size(width: int, height: int, frames: int, image: bool) -> str:
    return f"{width}x{height}, {frames} frames" + (", from an image" if image else "")


def rows() -> list[Row]:
    """The presets (the self-test ones aside), then the sizes and GGUF files above, each model and size once."""
    found, seen = [], {}

    def add(title: str, ref: str, width: int, height: int, frames: int, image: bool, note: str = "",
            preset: str | None = None):
        key = (ref, width, height, frames, image)
        if key in seen:   # another preset of the same model and size (a 4-step one): named in the same table
            row = found[seen[key]]
            if preset:
                found[seen[key]] = replace(row, title=row.title.replace("`)", f"`, `{preset}`)")
                                           .replace("(preset `", "(presets `"))
            return
        seen[key] = len(found)
        spec = KNOWN_MODELS.get(ref)
        if spec is None:
            found.append(Row(title, None, PlanRequest(width, height, frames, image), f"{ref} has no known shape"))
            return
        found.append(Row(title, spec, PlanRequest(width, height, frames, image), note))

    for name, preset in load_presets().items():
        s = preset.settings
        if s.model.startswith("selftest-"):
            continue
        spec = KNOWN_MODELS.get(s.model)
        label = spec.name if spec else s.model
        extra = "; with its LoRAs (not counted: see below)" if s.loras else ""
        add(f"{label}, {_size(s.width, s.height, s.frames, s.mode == 'i2v')} (preset `{name}`)", s.model, s.width,
            s.height, s.frames, s.mode == "i2v", extra.removeprefix("; "), preset=name)
    for ref, width, height, frames, image in SIZES:
        name = KNOWN_MODELS[ref].name
        add(f"{name}, {_size(width, height, frames, image)}", ref, width, height, frames, image)
    for quantization, bits in GGUF_TYPES:
        spec = gguf_spec(T2V_14B, quantization, bits)
        file_gb = spec.transformer_files[0].quantized_bytes / 2**30
        for width, height, frames in GGUF_SIZES:
            found.append(Row(f"Wan2.1 T2V 14B from a {quantization} GGUF file (about {file_gb:.1f} GB), "
                             f"{_size(width, height, frames, False)}", spec, PlanRequest(width, height, frames)))
    return found


# The planner's tips, shortened for a table cell: "Use 65 frames instead of 81." -> "65 frames".
TIPS = (r"Use (\d+ frames?) instead", r"Use (\d+x\d+) instead", r"Use a smaller model: (.+?) \(")


def _fits_with(plan: Plan) -> str:
    """'fits with 65 frames, or 624x352' from the plan's suggestions; '' when nothing smaller fits."""
    found = [m[1] for tip in plan.suggestions for pattern in TIPS if (m := re.match(pattern, tip))]
    return f"; fits with {', or '.join(found)}" if found else ""


def _cells(plan: Plan) -> str:
    if not plan.fits:
        return f"**does not fit**{_fits_with(plan)} | | | | | |"
    tiles = f"{plan.vae_tile}px" if plan.vae_tiled else "no"
    return (f"`{plan.strategy}` | {plan.text_encoder} | {tiles} | {'yes' if plan.fp8 else 'no'} | "
            f"{plan.predicted_peak_vram_gb:.1f} | {plan.predicted_peak_ram_gb:.1f} |")


def table(row: Row) -> str:
    """One model and size on every profile."""
    lines = [f"### {row.title}", ""]
    if row.note:
        lines += [f"_{row.note[0].upper()}{row.note[1:]}._", ""]
    if row.spec is None:
        return "\n".join(lines)
    lines += ["| machine | plan | text encoder | VAE tiles | fp8 | peak device GB | peak RAM GB |",
              "|---|---|---|---|---|--:|--:|"]
    for name, profile in PROFILES.items():
        lines.append(f"| {name} | {_cells(plan_memory(row.spec, row.request, profile))}")
    return "\n".join(lines)


def tables() -> str:
    return "\n\n".join(table(row) for row in rows()) + "\n"


def write_doc(doc: Path) -> None:
    """Put the tables between the doc's markers (the rest of the doc is written by hand)."""
    text = doc.read_text()
    head, found, rest = text.partition(BEGIN)
    _, ended, tail = rest.partition(END)
    if not (found and ended):
        raise SystemExit(f"{doc} has no {BEGIN} ... {END} markers to write the tables between")
    doc.write_text(f"{head}{BEGIN}\n{tables()}{END}{tail}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--doc", type=Path, help="write the tables into this markdown file, between its markers")
    args = parser.parse_args(argv)
    if args.doc:
        write_doc(args.doc)
    else:
        print(tables(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
