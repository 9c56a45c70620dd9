"""Extending a video: a new part from its last frame, its colours matched, joined after it into one mp4.

Real parts all the way: the self-test models, ffmpeg writing, reading and joining the files.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from engine.errors import InputError
from engine.events import JobFinished, PhaseFinished, PostProgress
from engine.mp4_boxes import video_codec_config, video_frame_count
from engine.outputs.export import read_video, write_mp4
from engine.outputs.history import find_entry, reuse_values
from engine.post.extend import COPIED, ENCODED_AGAIN, ColourMatch, from_lab, to_lab
from engine.run.engine import Engine
from engine.settings.request import check_request, check_request_with_notes
from tests.conftest import CPU, one_torch_thread, run_engine, tiny_request

T2V = dict(width=64, height=64, frames=9, steps=2)
PART = dict(width=64, height=64, frames=5, steps=2)


@pytest.fixture(autouse=True)
def one_thread():
    with one_torch_thread():
        yield


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    engine = Engine(tmp_path_factory.mktemp("extend-models"), CPU)
    yield engine
    engine.unload()


@pytest.fixture(scope="module")
def made(engine, presets, tmp_path_factory):
    """A self-test output (9 frames), and the extension of it (5 more frames asked, the first shared)."""
    outputs = tmp_path_factory.mktemp("extend-outputs")
    first, _ = run_engine(engine, check_request(tiny_request(presets, "selftest-t2v", outputs, **T2V)))
    assert isinstance(first, JobFinished), first
    extended, events = run_engine(engine, check_request(tiny_request(
        presets, "selftest-i2v", outputs, mode="i2v", extend=first.paths[0], prompt="and then it runs", **PART)))
    assert isinstance(extended, JobFinished), extended
    return {"outputs": outputs, "first": first, "extended": extended, "events": events}


def _key(result: JobFinished) -> str:
    path = Path(result.paths[0])
    return f"{path.parent.name}/{path.name}"


def test_the_joined_video_holds_the_video_s_frames_exactly_then_the_new_part_s(made):
    before, _ = read_video(made["first"].paths[0])
    after, fps = read_video(made["extended"].paths[0])
    assert len(after) == len(before) + PART["frames"] - 1 == 13 and fps == 16   # the part's first is the video's last
    assert np.array_equal(after[:len(before)], before)                          # bit for bit
    assert video_codec_config(made["extended"].paths[0]) == video_codec_config(made["first"].paths[0])
    phases = [e.phase for e in made["events"] if isinstance(e, PhaseFinished)]
    assert phases[-1] == "join" and "export" in phases
    progress = [e for e in made["events"] if isinstance(e, PostProgress) and e.step == "join"]
    assert progress and progress[-1].done == progress[-1].total == PART["frames"] - 1
    assert "It extends" in made["extended"].note


def test_the_sidecar_names_the_video_every_part_and_the_join(made):
    sidecar = json.loads(Path(made["extended"].sidecar).read_text())
    record = sidecar["extend"]
    assert record["source"] == _key(made["first"]) and record["how"] == COPIED
    assert record["source_frames"] == 9 and record["part_frames"] == 4 and record["frames"] == 13
    assert sidecar["output"]["frames"] == 13 and sidecar["timings"]["join"] > 0
    parts = record["parts"]
    assert [part["frames"] for part in parts] == [9, 4]
    assert parts[0]["prompt"] == "a red fox in the snow" and parts[0]["settings"]["mode"] == "t2v"
    assert parts[1]["prompt"] == "and then it runs" and parts[1]["settings"]["frames"] == PART["frames"]
    assert record["colours"]["space"] == "CIE Lab" and len(record["colours"]["scale"]) == 3
    # The video extended is an output: it is named, not copied.
    assert not list(Path(made["extended"].paths[0]).parent.glob("*.source.mp4"))


def test_reuse_makes_the_extension_again_and_an_extension_of_it_lists_all_parts(made, engine, presets):
    entry = find_entry(made["outputs"], _key(made["extended"]))
    values = reuse_values(entry)
    assert values.tab == "i2v" and values.extend == made["first"].paths[0] and values.image is None
    assert values.settings.frames == PART["frames"] and entry.made["frames"] == 13
    again, _ = run_engine(engine, check_request(tiny_request(
        presets, "selftest-i2v", made["outputs"], mode="i2v", extend=values.extend, prompt=values.prompt,
        seed=values.seed, **PART)))
    assert np.array_equal(read_video(again.paths[0])[0], read_video(made["extended"].paths[0])[0])
    further, _ = run_engine(engine, check_request(tiny_request(
        presets, "selftest-i2v", made["outputs"], mode="i2v", extend=made["extended"].paths[0], **PART)))
    record = json.loads(Path(further.sidecar).read_text())["extend"]
    assert [part["frames"] for part in record["parts"]] == [9, 4, 4] and record["frames"] == 17
    assert np.array_equal(read_video(further.paths[0])[0][:13], read_video(made["extended"].paths[0])[0])


def test_the_colour_match_moves_the_part_s_mean_to_the_video_s():
    rng = np.random.default_rng(1)
    video = (rng.random((24, 32, 3)) * 200 + 20).astype(np.uint8)
    tinted = np.clip(video.astype(int) * [1.15, 0.9, 0.8] + [10, 0, -5], 0, 255).astype(np.uint8)   # warmer, drifted
    match = ColourMatch.between(video, tinted)
    moved = match.apply(tinted)
    for channel in range(3):
        before = abs(tinted[..., channel].mean() - video[..., channel].mean())
        after = abs(moved[..., channel].mean() - video[..., channel].mean())
        assert after < before / 4
    lab = to_lab(video)
    assert np.abs(from_lab(lab).astype(int) - video).max() <= 1     # the colour space goes and comes back
    same = ColourMatch.between(video, video)
    assert np.abs(same.apply(video).astype(int) - video).max() <= 1  # a part that did not drift stays as it is


def test_a_video_from_elsewhere_is_copied_scaled_and_encoded_again(engine, presets, outputs, tmp_path):
    import imageio_ffmpeg

    ramp = np.linspace(0, 255, 96 * 64 * 3).reshape(64, 96, 3)
    frames = np.stack([np.roll(ramp, 3 * i, axis=1) for i in range(12)]).astype(np.uint8)
    raw = tmp_path / "raw.mp4"
    write_mp4(frames, raw, 24)
    foreign = tmp_path / "phone clip.mp4"   # another encoder's set-up (x264's defaults), as a phone's would differ
    subprocess.run([imageio_ffmpeg.get_ffmpeg_exe(), "-v", "error", "-i", str(raw), "-c:v", "libx264", "-crf", "20",
                    "-pix_fmt", "yuv420p", str(foreign)], check=True)
    request, notes = check_request_with_notes(tiny_request(presets, "selftest-i2v", outputs, mode="i2v",
                                                           extend=str(foreign), width=96, height=64, frames=5,
                                                           steps=2))
    assert request.settings.fps == 24 and any("made at 24 fps" in note for note in notes)
    result, _ = run_engine(engine, request)
    assert isinstance(result, JobFinished), result
    record = json.loads(Path(result.sidecar).read_text())["extend"]
    assert record["how"] == ENCODED_AGAIN and record["source"] == "phone clip.mp4" and record["frames"] == 16
    assert video_frame_count(result.paths[0]) == 16 and read_video(result.paths[0])[1] == 24
    kept = Path(result.paths[0]).with_name(Path(result.paths[0]).stem + ".source.mp4")
    assert kept.read_bytes() == foreign.read_bytes()                       # an upload's video is kept beside it
    # A part made at another size of the same shape is scaled to the video's.
    scaled, _ = run_engine(engine, check_request(tiny_request(presets, "selftest-i2v", outputs, mode="i2v",
                                                              extend=str(raw), width=48, height=32, frames=5,
                                                              steps=2)))
    record = json.loads(Path(scaled.sidecar).read_text())["extend"]
    assert record["scaled_from"] == [48, 32] and read_video(scaled.paths[0])[0].shape == (16, 64, 96, 3)


def test_what_cannot_be_joined_is_refused_before_any_work(presets, outputs, made, image_file, tmp_path):
    video = made["first"].paths[0]
    with pytest.raises(InputError, match="another shape than the new part's 96x48: set the size to 64x64"):
        check_request(tiny_request(presets, "selftest-i2v", outputs, mode="i2v", extend=video, width=96,
                                   height=48, frames=5))
    with pytest.raises(InputError, match="(?i)a first frame and a video to extend were both given"):
        check_request(tiny_request(presets, "selftest-i2v", outputs, mode="i2v", extend=video, image=str(image_file),
                                   **PART))
    with pytest.raises(InputError, match="(?i)a video to extend was given but the mode is text-to-video"):
        check_request(tiny_request(presets, "selftest-t2v", outputs, extend=video, **PART))
    with pytest.raises(InputError, match="which the new part cannot match made 4x smoother"):
        fast = tmp_path / "fast.mp4"
        write_mp4(np.zeros((5, 64, 64, 3), np.uint8), fast, 30)
        check_request(tiny_request(presets, "selftest-i2v", outputs, mode="i2v", extend=str(fast), interpolate=4,
                                   **PART))
    with pytest.raises(InputError, match="does not exist"):
        check_request(tiny_request(presets, "selftest-i2v", outputs, mode="i2v", extend=str(tmp_path / "gone.mp4"),
                                   **PART))


# ----- decoding an extension again, cancelling its join -----------------------------------------------------------
def _latents_of(result: JobFinished) -> Path:
    from engine.outputs.bundle import Bundle

    return Bundle.from_media(result.paths[0]).latents


def test_decode_again_joins_the_new_part_after_its_video_again(made, engine):
    latents = _latents_of(made["extended"])
    assert latents.exists()
    again = engine.decode_saved(str(latents), "again", lambda event: None)
    assert isinstance(again, JobFinished), again
    frames, _ = read_video(again.paths[0])
    assert len(frames) == 13 and again.paths[0] != made["extended"].paths[0]
    assert np.array_equal(frames[:9], read_video(made["first"].paths[0])[0])   # the video's own frames, bit for bit
    sidecar = json.loads(Path(again.sidecar).read_text())
    assert sidecar["extend"]["source"] == _key(made["first"]) and sidecar["extend"]["frames"] == 13
    assert sidecar["decoded_from"] == str(latents) and sidecar["output"]["frames"] == 13 and "It extends" in again.note


def test_decode_again_joins_a_kept_copy_or_says_the_part_is_alone(engine, presets, outputs, tmp_path):
    clip = tmp_path / "clip.mp4"
    write_mp4(np.full((7, 64, 64, 3), 90, np.uint8), clip, 16)
    result, _ = run_engine(engine, check_request(tiny_request(presets, "selftest-i2v", outputs, mode="i2v",
                                                              extend=str(clip), **PART)))
    assert isinstance(result, JobFinished), result
    latents = _latents_of(result)
    clip.unlink()   # the upload is gone: the copy the run kept beside its output is joined instead
    again = engine.decode_saved(str(latents), "kept", lambda event: None)
    assert isinstance(again, JobFinished) and video_frame_count(again.paths[0]) == 11, again
    assert np.array_equal(read_video(again.paths[0])[0], read_video(result.paths[0])[0])
    Path(result.paths[0]).with_name(Path(result.paths[0]).stem + ".source.mp4").unlink()
    alone = engine.decode_saved(str(latents), "alone", lambda event: None)
    assert isinstance(alone, JobFinished) and video_frame_count(alone.paths[0]) == PART["frames"], alone
    assert "clip.mp4) is no longer there: this is the new part alone" in alone.note
    assert "extend" not in json.loads(Path(alone.sidecar).read_text())


@pytest.mark.parametrize("keep", [False, True])
def test_a_cancel_in_the_join_keeps_nothing_new(engine, presets, made, tmp_path, keep):
    from engine.events import JobCancelled, PhaseStarted

    outputs = tmp_path / "outputs"
    before = {p.name for p in Path(made["first"].paths[0]).parent.iterdir()}
    events = []
    joining = lambda: any(isinstance(e, PhaseStarted) and e.phase == "join" for e in events)   # noqa: E731
    request = check_request(tiny_request(presets, "selftest-i2v", outputs, mode="i2v", extend=made["first"].paths[0],
                                         keep_latents=keep, **PART))
    result = engine.run(request, "cancelled", events.append, joining)
    assert isinstance(result, JobCancelled) and result.phase == "join", result
    written = sorted(p.name for p in outputs.rglob("*") if p.is_file())
    # Nothing at the output's name (no part alone, no sidecar); the latents (and the inputs kept to decode them
    # again) only when they were asked for.
    kept = (".latents.safetensors", ".first.png", ".source.mp4")
    assert sorted(name[name.index("."):] for name in written) == (sorted(kept) if keep else []), written
    assert {p.name for p in Path(made["first"].paths[0]).parent.iterdir()} == before   # the video extended is kept
