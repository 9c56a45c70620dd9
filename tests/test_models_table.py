"""docs/models.md's memory tables: one per model and size, a line per machine, as the planner says now."""
from __future__ import annotations

import re

import pytest

from bench.models_table import BEGIN, END, PROFILES, SIZES, rows, tables
from engine.planning.planner import LADDER
from engine.settings.presets import load_presets
from tests.conftest import ROOT

pytestmark = pytest.mark.slow   # in process, but every model's table on every machine: seconds of planning


@pytest.fixture(scope="module")
def written() -> str:
    return tables()


def test_every_model_and_size_has_a_table_with_a_line_per_machine(written):
    sections = written.split("### ")[1:]
    assert [section.splitlines()[0] for section in sections] == [row.title for row in rows()]
    presets = [name for name, preset in load_presets().items() if not preset.settings.model.startswith("selftest-")]
    for name in presets:
        assert sum(f"`{name}`" in section.splitlines()[0] for section in sections) == 1, name
    for ref, width, height, frames, image in SIZES:   # each size beyond the presets', once (a preset's or its own)
        size = f"{width}x{height}, {frames} frames" + (", from an image" if image else "")
        assert any(size in section.splitlines()[0] for section in sections), (ref, size)
    assert sum("GGUF file" in section.splitlines()[0] for section in sections) == 4
    for section in sections:
        lines = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| machine")]
        assert [line.split(" | ")[0][2:] for line in lines] == list(PROFILES), section.splitlines()[0]
        for line in lines:
            plan = line.split(" | ")[1]
            assert plan.startswith("**does not fit**") or plan.strip("`") in LADDER, line
            if not plan.startswith("**"):
                device, ram = (float(cell) for cell in line.rstrip(" |").split(" | ")[-2:])
                assert 0 < device < 140 and 0 < ram < 128, line


def test_the_tables_tell_the_machines_apart(written):
    """The planner's answers differ by machine: the H200 holds everything, the 16 GB laptop nothing, and a Q4_K
    GGUF file brings the 14B to a 12 GB card where its own weights do not fit."""
    def line(title_start: str, machine: str) -> str:
        section = next(s for s in written.split("### ") if s.startswith(title_start))
        return next(row for row in section.splitlines() if row.startswith(f"| {machine} |"))

    h200, laptop, card = list(PROFILES)[-1], list(PROFILES)[0], "12 GB GPU (RTX 3060 / 4070), 32 GB RAM"
    assert all("`all_on_device`" in line(row.title, h200) for row in rows())
    assert all("does not fit" in line(row.title, laptop) for row in rows())
    assert "does not fit" in line("Wan2.1 T2V 14B, 832x480, 81 frames", card)
    assert "`group_offload`" in line("Wan2.1 T2V 14B from a Q4_K GGUF file", card)


def test_docs_models_md_holds_the_tables_as_the_planner_says_them_now(written):
    doc = (ROOT / "docs" / "models.md").read_text()
    between = re.search(re.escape(BEGIN) + r"\n(.*)" + re.escape(END), doc, re.S)
    assert between and between[1] == written, \
        "docs/models.md is out of date: run python bench/models_table.py --doc docs/models.md"
