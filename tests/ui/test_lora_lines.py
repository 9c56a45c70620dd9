"""The LoRA box's text as the list of sliders edits it: one line at a time, the rest left as written."""
from __future__ import annotations

from engine.models.loras import Lora
from engine.settings.loras import listed_lora_files, parse_lora_lines
from ui.views.lora_lines import LoraRow, lora_rows, with_lora, with_strength, without

BOX = "# the styles\ndetail.safetensors: 0.8\n\nC:\\loras\\speed.safetensors: 1@low"


def test_each_lora_line_is_a_row_with_its_line_number():
    assert lora_rows(BOX) == [LoraRow(1, Lora("detail.safetensors", 0.8)),
                              LoraRow(3, Lora("C:\\loras\\speed.safetensors", 1.0, "low"))]
    assert lora_rows("") == [] and lora_rows(None) == []


def test_a_box_that_does_not_read_has_no_rows():
    assert lora_rows("detail.safetensors: 0.8\ndetail.safetensors: lots") == []


def test_adding_appends_the_file_at_strength_one_once():
    added = with_lora(BOX, "new.safetensors")
    assert added == BOX + "\nnew.safetensors: 1"
    assert with_lora(added, "new.safetensors") == added, "the same file was added twice"
    assert with_lora("", "new.safetensors") == "new.safetensors: 1"
    assert with_lora("a.safetensors: 0.5\n\n", "b.safetensors") == "a.safetensors: 0.5\nb.safetensors: 1"


def test_a_file_in_one_expert_only_can_still_be_added_for_both():
    text = "speed.safetensors: 1@high"
    assert with_lora(text, "speed.safetensors") == "speed.safetensors: 1@high\nspeed.safetensors: 1"


def test_a_strength_rewrites_its_line_only_keeping_the_path_and_expert():
    high, low = lora_rows(BOX)
    changed = with_strength(BOX, low, 0.85000000001)
    assert changed == "# the styles\ndetail.safetensors: 0.8\n\nC:\\loras\\speed.safetensors: 0.85@low"
    assert parse_lora_lines(changed)[1] == Lora("C:\\loras\\speed.safetensors", 0.85, "low")
    assert with_strength(BOX, high, -1.5).splitlines()[1] == "detail.safetensors: -1.5"
    assert with_strength(BOX, high, 0).splitlines()[1] == "detail.safetensors: 0"


def test_removing_deletes_its_line_only():
    high, low = lora_rows(BOX)
    assert without(BOX, high) == "# the styles\n\nC:\\loras\\speed.safetensors: 1@low"
    assert without(without(BOX, low), high) == "# the styles"
    assert lora_rows(without(without(BOX, low), high)) == []


def test_an_edit_of_a_line_edited_meanwhile_leaves_the_box_as_it_is():
    row = lora_rows(BOX)[0]
    typed = BOX.replace("detail.safetensors", "other.safetensors")
    assert with_strength(typed, row, 2) == typed
    assert without(typed, row) == typed
    assert without("", row) == ""


def test_the_lora_folder_lists_its_safetensors_files_by_name(tmp_path):
    assert listed_lora_files(tmp_path) == []
    folder = tmp_path / "loras"
    (folder / "styles").mkdir(parents=True)
    for name in ("b.safetensors", "A.SAFETENSORS", "styles/c.safetensors", "notes.txt"):
        (folder / name).write_bytes(b"")
    assert listed_lora_files(tmp_path) == ["A.SAFETENSORS", "b.safetensors", "styles/c.safetensors"]


def test_a_typed_strength_past_the_ends_is_set_to_the_nearest_and_said():
    from ui.views.lora_lines import typed_strength

    assert typed_strength("0.5", 4.0) == (0.5, "") and typed_strength(-4, 4.0) == (-4.0, "")
    assert typed_strength(7, 4.0) == (4.0, "A LoRA strength goes from -4 to 4: 7 was set to 4.")
    assert typed_strength("-12.5", 4.0) == (-4.0, "A LoRA strength goes from -4 to 4: -12.5 was set to -4.")
    for nonsense in ("", "abc", None, float("nan"), "inf"):
        strength, note = typed_strength(nonsense, 4.0)
        assert strength is None and "left as it was" in note
