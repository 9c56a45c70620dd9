"""Several videos from one request: seeds seed, seed + 1, ..., each its own output and sidecar, one job."""
from __future__ import annotations

import json

import pytest

from engine.events import JobCancelled, JobFinished, PhaseStarted, VideoStarted
from engine.run.engine import Engine
from engine.settings.values import InputError, Settings, check_settings
from tests.conftest import CPU, run_engine, tiny_request
from ui.views.job_view import JobView


def test_three_videos_have_three_seeds_and_sidecars_and_load_once(selftest_models_dir, presets, outputs):
    engine = Engine(selftest_models_dir, CPU)
    result, events = run_engine(engine, tiny_request(presets, "selftest-t2v", outputs, count=3, seed=41, steps=2))
    assert isinstance(result, JobFinished), result
    assert result.seeds == (41, 42, 43) and len(result.paths) == len(set(result.paths)) == 3
    assert [json.loads(open(s).read())["seed"] for s in result.sidecars] == [41, 42, 43]
    assert sorted(p.name for p in outputs.rglob("*.mp4")) == sorted(p.rsplit("/", 1)[-1] for p in result.paths)
    assert [(e.video, e.videos) for e in events if isinstance(e, VideoStarted)] == [(2, 3), (3, 3)]
    assert [e.phase for e in events if isinstance(e, PhaseStarted)].count("load") <= 1   # one model, loaded once
    # The seed and sidecar said for the job are the first video's: the one the page shows (its seed box, its player).
    assert result.seed == 41 and result.sidecar == result.sidecars[0] and result.paths[0].endswith("_41.mp4")
    view, said = JobView(), []
    for event in events:
        said.append(view.apply(event).status)
    assert "3 outputs, seeds 41, 42, 43" in view.status
    # Which video the status speaks of is said once, whatever events come between.
    assert any(text.startswith("Video 2 of 3: ") for text in said) and not any("of 3: Video" in t for t in said)


def test_random_seeds_differ_and_a_cancel_after_the_first_leaves_one(selftest_models_dir, presets, outputs):
    engine = Engine(selftest_models_dir, CPU)
    events: list = []
    request = tiny_request(presets, "selftest-t2v", outputs, count=3, seed=-1, steps=2)
    result = engine.run(request, "job", events.append,
                        lambda: any(isinstance(e, VideoStarted) for e in events))
    assert isinstance(result, JobCancelled), result
    assert (result.video, result.videos) == (2, 3) and len(result.written) == 1
    assert [str(p) for p in outputs.rglob("*.mp4")] == list(result.written)
    view = JobView()
    for event in events:
        view.apply(event)
    assert "it stopped in video 2 of 3; the 1 output made before it is kept (in History)" in view.status
    again, _ = run_engine(engine, tiny_request(presets, "selftest-t2v", outputs, count=2, seed=-1, steps=2))
    assert len(set(again.seeds)) == 2


def test_a_count_out_of_range_is_refused_with_its_sentence():
    base = Settings("selftest-t2v", "t2v", 64, 64, 9, 4, 5.0, 3.0)
    assert check_settings(base.changed(count="2")).count == 2
    for count in (0, 17, 2.5):
        with pytest.raises(InputError, match="(?i)count (.* is out of range|must be a whole number)"):
            check_settings(base.changed(count=count))


def test_a_job_of_several_videos_is_predicted_as_the_first_then_each_other_on_the_loaded_model():
    from engine.planning.timing import PhaseTimes
    from engine.planning.job_time import videos_seconds

    first = PhaseTimes({"load": 5.0, "text_encode": 2.0, "denoise": 10.0}, {}, 1.0, 10, 2, 1, 1, 17.0)
    loaded = PhaseTimes({"text_encode": 1.0, "denoise": 10.0}, {}, 1.0, 10, 2, 1, 1, 11.0, loaded=True)
    assert videos_seconds(first, loaded, 1) == 17.0 and videos_seconds(first, loaded, 3) == 17.0 + 2 * 10.0
