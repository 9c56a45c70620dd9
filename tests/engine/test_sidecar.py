"""The sidecar schema: what a run writes, that it reads back the same, and that old sidecars read as before."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from engine.outputs.bundle import Bundle
from engine.outputs.history import read_entry
from engine.outputs.record import redecode_record, run_record
from engine.outputs.sidecar import SCHEMA, Sidecar, SidecarError, read_sidecar, write_sidecar
from engine.settings.values import SOURCE_CHOICES, SPEED_CHOICES
from engine.settings.request import GenerationRequest

STEM = "120000_i2v_a-fox_7"
REQUEST = GenerationRequest.from_dict(dict(
    mode="i2v", prompt="a fox", model="org/fox", width=64, height=48, frames=5, steps=2, guidance=5, shift=3.0,
    seed=7, negative_prompt="blurry", preset="fox-preset", sigmas=(0.5, 0.25), image="/uploads/fox.png",
    outputs_dir="/outputs"))
MODEL = SimpleNamespace(ref="org/fox", source="hub", revision="abc123", pipeline_class="WanImageToVideoPipeline",
                        spec=None)
INPUTS = {"image": f"{STEM}.first.png", "last_image": None}

# What record.py wrote before the schema number, key for key (a run, then a decode again).
OLD_RUN = {
    "app": {"name": "wan-studio", "version": "0.9.0"}, "created": "2025-01-31T12:00:00+0100", "file": f"{STEM}.mp4",
    "mode": "i2v", "prompt": "a fox", "negative_prompt": "blurry", "seed": 7,
    "model": {"ref": "org/fox", "source": "hub", "revision": "abc123", "pipeline": "WanImageToVideoPipeline"},
    "preset": "fox-preset",
    "parameters": {"mode": "i2v", "model": "org/fox", "width": 64, "height": 48, "frames": 5, "steps": 2,
                   "guidance": 5, "shift": 3.0, "seed": 7, "fps": 16, "image": "/uploads/fox.png", "last_image": None,
                   "preset": "fox-preset", "size_multiple": 16, "scheduler": "unipc", "sigmas": [0.5, 0.25],
                   "strategy": None, "text_encoder": None, "vae_tiling": None, "keep_latents": False},
    "output": {"frames": 5, "height": 48, "width": 64, "fps": 16},
    "plan": {"strategy": "all_on_device", "device": "cpu", "decisions": ["everything fits"]},
    "step_downs": [], "latents": f"/outputs/2025-01-31/{STEM}.latents.safetensors", "decode_fallback": None,
    "model_reused": False, "timings": {"load": 1.5, "denoise": 2.25, "export": 0.5}, "step_seconds": [1.0, 1.25],
    "peak_vram_gb": None, "peak_ram_gb": 1.75, "versions": {"app": "0.9.0", "torch": "2.5.0"},
    "hardware": {"backend": "cpu", "device_name": "test-cpu"}, "inputs": INPUTS, "note": "a note",
}
OLD_DECODED = {
    "app": {"name": "wan-studio", "version": "0.9.0"}, "file": f"{STEM}.mp4",
    "decoded_from": f"/outputs/2025-01-31/{STEM}.latents.safetensors", "decoded": "tiled", "prompt": "a fox",
    "seed": 7, "model": {"ref": "org/fox", "revision": "abc123"},
    "parameters": dict(OLD_RUN["parameters"], prompt="a fox", negative_prompt="blurry", outputs_dir="/outputs"),
    "timings": {"load": 0.5, "vae_decode": 1.0, "export": 0.25}, "peak_vram_gb": 0.5, "peak_ram_gb": 1.5,
    "versions": {"app": "0.9.0"}, "hardware": {"backend": "cpu"}, "inputs": INPUTS,
}


def _run_sidecar(**changes) -> Sidecar:
    frames = np.zeros((5, 48, 64, 3), np.float32)
    return run_record(REQUEST, Path(f"{STEM}.mp4"), frames, model=MODEL, plan={"strategy": "all_on_device",
                      "decisions": ("everything fits",)}, step_downs=[{"phase": "denoise", "from": "a", "to": "b"}],
                      latents="/l.latents.safetensors", decode_fallback=None, timings={"load": 1.5, "denoise": 2.0},
                      step_seconds=[1.0, 1.0], peak_ram_gb=1.25, hardware={"backend": "cpu", "sizes": (1, 2)},
                      **changes)


def _decoded_sidecar() -> Sidecar:
    return redecode_record(REQUEST, Path(f"{STEM}.mp4"), Path("/l.latents.safetensors"), "on the CPU",
                           {"ref": "org/fox", "revision": "abc123"}, REQUEST.to_dict(), {"vae_decode": 1.0}, 2.0,
                           {"backend": "cpu"}, inputs=INPUTS)


def _through_a_file(data: dict) -> dict:
    return json.loads(json.dumps(data, indent=2, ensure_ascii=False, default=str))


# ----- writing ----------------------------------------------------------------------
def test_a_run_writes_every_key_it_always_wrote_and_the_schema_first():
    data = _run_sidecar(inputs=INPUTS, note="a note").to_json()
    assert list(data) == ["schema", *OLD_RUN] and data["schema"] == SCHEMA == 1
    assert data["app"]["name"] == "wan-studio" and data["file"] == f"{STEM}.mp4"
    assert data["output"] == {"frames": 5, "height": 48, "width": 64, "fps": 16}
    old = OLD_RUN["parameters"]   # every value it always wrote, no prompts, no folder (the order is free)
    assert {key: data["parameters"][key] for key in old} == old
    assert set(data["parameters"]) - set(old) == {*SPEED_CHOICES, *SOURCE_CHOICES, "gpus", "window", "overlap", "count",
                                                          "interpolate", "upscale", "strength", "video",
                                                          "extend"}   # came later
    assert data["model_reused"] is False and data["latents"] == "/l.latents.safetensors"
    plain = _run_sidecar().to_json()
    assert "inputs" not in plain and "note" not in plain   # only when there are some


def test_a_decode_again_writes_its_own_keys():
    data = _decoded_sidecar().to_json()
    assert list(data) == ["schema", *OLD_DECODED]
    assert (data["decoded"], data["decoded_from"]) == ("on the CPU", "/l.latents.safetensors")
    assert data["parameters"]["sigmas"] == [0.5, 0.25] and data["parameters"]["outputs_dir"] == "/outputs"


def test_a_still_records_no_frame_rate():
    frames = np.zeros((1, 48, 64, 3), np.float32)
    still = run_record(REQUEST.with_values(mode="t2i", image=None), Path(f"{STEM}.png"), frames, model=MODEL, plan={},
                       step_downs=[], latents=None, decode_fallback=None, timings={}, step_seconds=[], peak_ram_gb=1.0,
                       hardware={})
    assert still.fps is None and still.to_json()["output"] == {"frames": 1, "height": 48, "width": 64, "fps": None}


# ----- reading back -------------------------------------------------------------------
@pytest.mark.parametrize("make", [_run_sidecar, _decoded_sidecar], ids=["run", "decoded"])
def test_a_sidecar_reads_back_as_it_was_written(make, tmp_path):
    sidecar = make()
    assert Sidecar.from_json(_through_a_file(sidecar.to_json())) == sidecar
    path = write_sidecar(sidecar, tmp_path / f"{STEM}.json")
    assert read_sidecar(path) == sidecar and [p.name for p in tmp_path.iterdir()] == [f"{STEM}.json"]


def test_a_read_sidecar_has_the_settings_wherever_they_were():
    run, decoded = Sidecar.from_json(OLD_RUN), Sidecar.from_json(OLD_DECODED)
    for sidecar in (run, decoded):
        assert (sidecar.mode, sidecar.prompt, sidecar.negative_prompt, sidecar.seed, sidecar.model, sidecar.preset) \
            == ("i2v", "a fox", "blurry", 7, "org/fox", "fox-preset")
        assert (sidecar.width, sidecar.height, sidecar.frames, sidecar.steps, sidecar.guidance, sidecar.shift,
                sidecar.fps) == (64, 48, 5, 2, 5.0, 3.0, 16)
        assert sidecar.schema == 0 and sidecar.inputs == INPUTS
    assert run.strategy == "all_on_device" and run.created == OLD_RUN["created"] and run.decoded is None
    assert run.run.step_seconds == [1.0, 1.25] and run.note == "a note"
    assert decoded.strategy is None and decoded.created is None and decoded.run is None
    assert decoded.decoded.how == "tiled" and decoded.decoded.latents == OLD_DECODED["decoded_from"]


@pytest.mark.parametrize("old", [OLD_RUN, OLD_DECODED], ids=["run", "decoded"])
def test_an_old_sidecar_reads_the_same_as_a_new_one(old, tmp_path):
    """The same output described by an old sidecar (no schema number) and a new one gives the same entry."""
    new = Sidecar.from_json(old)
    written = new.to_json()                                # nothing of the old file is lost on the way
    assert written == {"schema": 0, **old} and list(written) == ["schema", *old]
    new = replace(new, schema=SCHEMA)
    entries = []
    for name, data in (("old", old), ("new", new.to_json())):
        bundle = Bundle(tmp_path / name / "2025-01-31" / STEM)
        bundle.stem.parent.mkdir(parents=True)
        for path in (bundle.video, bundle.input("image")):
            path.write_bytes(b"x")
        bundle.sidecar.write_text(json.dumps(data))
        entries.append(read_entry(bundle.sidecar))
    assert "schema" not in old and json.loads(Path(entries[1].sidecar).read_text())["schema"] == SCHEMA
    old_entry, new_entry = (e.to_dict() for e in entries)
    for entry in (old_entry, new_entry):
        for key in ("media", "sidecar", "first_image"):
            entry[key] = Path(entry[key]).relative_to(tmp_path).parts[1:]
    assert old_entry == new_entry and old_entry["first_image"] == ("2025-01-31", f"{STEM}.first.png")
    assert (old_entry["mode"], old_entry["seed"], old_entry["preset"]) == ("i2v", 7, "fox-preset")


# ----- what is not a sidecar --------------------------------------------------------------
@pytest.mark.parametrize("change, why", [
    ({"app": {"name": "another-app"}}, "not a sidecar of this app"),
    ({"app": "wan-studio"}, "not a sidecar of this app"),
    ({"mode": "x2v", "parameters": dict(OLD_RUN["parameters"], mode="x2v")}, "needs the file name, the mode"),
    ({"prompt": 5}, "needs the file name, the mode"),
    ({"file": None}, "needs the file name, the mode"),
    ({"seed": None, "parameters": {k: v for k, v in OLD_RUN["parameters"].items() if k != "seed"}}, "not a number"),
    ({"parameters": {k: v for k, v in OLD_RUN["parameters"].items() if k != "frames"}}, "it has no frames"),
    ({"output": {"frames": float("inf")}}, "frames Infinity is out of range"),   # once raised out of the history
    # Numbers that no JSON reader holds exactly (a browser's, orjson's) once read the same and broke /history.
    ({"seed": 10**300}, r"seed 10+\.\.\. is out of range"),
    ({"parameters": dict(OLD_RUN["parameters"], width=1e308)}, "width 1e\\+308 is out of range"),
    ({"parameters": dict(OLD_RUN["parameters"], steps=2.5)}, "steps 2.5 is not a whole number"),
    ({"parameters": dict(OLD_RUN["parameters"], guidance="5")}, 'guidance "5" is not a number'),
    ({"parameters": dict(OLD_RUN["parameters"], height=True)}, "height true is not a number"),
    ({"schema": "one"}, "is not a version number"),
    ({"schema": -1}, "is not a version number"),
])
def test_what_cannot_be_read_is_a_sidecar_error(change, why, tmp_path):
    with pytest.raises(SidecarError, match=why):
        Sidecar.from_json(OLD_RUN | change)
    bundle = Bundle(tmp_path / "2025-01-31" / STEM)
    bundle.stem.parent.mkdir()
    bundle.video.write_bytes(b"x")
    bundle.sidecar.write_text(json.dumps(OLD_RUN | change))
    assert read_entry(bundle.sidecar) is None


def test_odd_parts_that_an_output_can_do_without_are_left_out():
    odd = Sidecar.from_json(OLD_RUN | {"timings": {"load": 1, "text": "n/a", "flag": None}, "peak_ram_gb": "lots",
                                       "plan": "fast", "inputs": ["x"], "created": "", "negative_prompt": None,
                                       "model": "org/fox", "note": None})
    assert odd.timings == {"load": 1.0} and odd.peak_ram_gb is None and odd.strategy is None
    assert odd.inputs is None and odd.created is None and odd.negative_prompt == "" and odd.note == ""
    assert odd.model == "org/fox" and odd.model_details is None    # taken from the parameters
    later = Sidecar.from_json(OLD_RUN | {"schema": SCHEMA + 1})    # a newer app's: read as far as it is understood
    assert later.schema == SCHEMA + 1 and later.prompt == "a fox"


def test_a_sidecar_is_a_runs_or_a_decode_agains():
    sidecar = _run_sidecar()
    with pytest.raises(ValueError, match="a run's"):
        replace(sidecar, run=None)
    with pytest.raises(ValueError, match="a run's"):
        replace(sidecar, decoded=_decoded_sidecar().decoded)


def test_a_decoded_again_output_made_larger_keeps_what_its_file_holds():
    from dataclasses import replace

    step = {"step": "upscale", "factor": 2, "method": "Lanczos", "seconds": 0.1, "frames": 5, "width": 128,
            "height": 96, "fps": 16, "source": "a.mp4"}
    larger = replace(_decoded_sidecar(), output={"frames": 5, "height": 96, "width": 128, "fps": 16}, post=[step])
    back = Sidecar.from_json(json.loads(json.dumps(larger.to_json())))
    assert back == larger and back.output["width"] == 128 and back.post == [step]
