"""The app started as a user starts it, on a free port, driven through gradio_client."""
from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest
from gradio_client import Client, handle_file

from engine.outputs.export import read_video
from tests.conftest import engine_pid
from tests.helpers.jobs import t2v

pytestmark = pytest.mark.server

T2V = ["selftest-t2v", "a red fox", "", "selftest-t2v", 64, 64, 9, 4, 5.0, 3.0, 7]


@pytest.fixture(scope="module")
def server(shared_app):
    return shared_app


@pytest.fixture
def log(server):
    """What the shared app's console says from this test's start on (other files' tests write to it too)."""
    start = len(server["log"].read_text())
    return lambda: server["log"].read_text()[start:]


def test_api_names_are_stable(client):
    endpoints = client.view_api(print_info=False, return_format="dict")["named_endpoints"]
    assert {"/text_to_video", "/text_to_image", "/image_to_video", "/cancel", "/plan"} <= set(endpoints)
    # The plan's choices, the LoRAs, the transformer files, the GPUs, Guidance 2 and the windows are the last inputs
    # and default to the planner's, none, the model's own, automatic, the same guidance, the model's own window and
    # one video, so callers may leave them out.
    for name in ("/text_to_video", "/text_to_image", "/image_to_video", "/video_to_video"):
        tail = {"/image_to_video": 1, "/video_to_video": 2}.get(name, 0)   # the videos, added after these
        parameters = endpoints[name]["parameters"]
        last = parameters[len(parameters) - 20 - tail:len(parameters) - tail]
        assert [(p["parameter_name"], p["parameter_default"]) for p in last] == [
            ("strategy", "Auto"), ("text_encoder", "Auto"), ("vae_tiling", "Auto"), ("decoder", "vae"),
            ("step_cache", "Off"), ("compile", "Auto"), ("attention", "Auto"), ("vae_precision", "Auto"),
            ("loras", ""), ("transformer", "(the model's own)"), ("transformer_2", "(the model's own)"),
            ("gpus", "Auto"), ("guidance_2", 0), ("window", 0), ("overlap", 16), ("count", 1),
            ("interpolate", 1), ("upscale", 1), ("guidance_batch", "Auto"), ("compute", "exact")], name
    # The videos come last and may be left out: none to extend; the input video's absence said in a sentence.
    extend, = endpoints["/image_to_video"]["parameters"][-1:]
    video, strength = endpoints["/video_to_video"]["parameters"][-2:]
    assert (extend["parameter_name"], extend["parameter_has_default"], extend["parameter_default"]) == (
        "extend", True, None)
    assert (video["parameter_has_default"], strength["parameter_default"]) == (True, 0.7)


def test_each_endpoint_s_signature_is_the_field_table_s_order(client):
    """The positional API is a view of engine/settings/fields.py: a new field lands in the table, and the
    endpoints follow (documented positions never move: new ones are added last)."""
    from engine.settings.fields import api_fields, plan_fields

    endpoints = client.view_api(print_info=False, return_format="dict")["named_endpoints"]

    def names(endpoint):
        return [p["parameter_name"] for p in endpoints[endpoint]["parameters"]]

    text = [f.api_name for f in api_fields("t2v")]
    assert names("/text_to_video") == names("/text_to_image") == text
    assert text[:11] == ["preset", "prompt", "negative_prompt", "model", "width", "height", "frames", "steps",
                         "guidance", "shift", "seed"]
    assert names("/image_to_video") == [f.api_name for f in api_fields("i2v")] == ["image", "last_image", *text,
                                                                                   "extend"]
    assert names("/video_to_video") == [f.api_name for f in api_fields("v2v")] == [*text, "video", "strength"]
    assert names("/plan") == [f.api_name for f in plan_fields()]
    assert names("/plan")[:8] == ["preset", "model", "width", "height", "frames", "strategy", "text_encoder",
                                  "vae_tiling"]


def test_plan_endpoint_shows_the_plan_for_the_settings(client):
    auto = client.predict("selftest-t2v", "selftest-t2v", 64, 64, 9, "Auto", "Auto", "Auto", api_name="/plan")
    assert "_For `selftest-t2v`, video 64x64, 9 frames, on " in auto
    assert "**Strategy: " in auto and "(fits)" in auto and "| Denoise |" in auto
    forced = client.predict("selftest-t2v", "selftest-t2v", 64, 64, 9, "group_offload", "Auto", "On",
                            api_name="/plan")
    assert "**Strategy: group_offload (on the CPU)** (fits)" in forced and "512px tile" in forced
    assert client.predict(api_name="/plan").startswith("_For `selftest-t2v`")   # every input has a default
    bad = client.predict("selftest-t2v", "selftest-t2v", 70, 64, 9, "Auto", "Auto", "Auto", api_name="/plan")
    assert bad.startswith("**No plan yet:** Width 70 is not a multiple of 16, which selftest-t2v needs: try 64 or 80.")
    # Fractions and lists are refused with the plan's own sentence, never rounded or a server error.
    for value, said in ((64.5, "Width must be a whole number, got 64.5"), ([64], "Width must be a whole number, "
                                                                             "got list")):
        assert said in client.predict("selftest-t2v", "selftest-t2v", value, 64, 9, "Auto", "Auto", "Auto",
                                      api_name="/plan")


def test_a_forced_strategy_runs_and_is_recorded_in_the_sidecar(client, server):
    video, status, _, _, *_ = client.predict(*T2V, strategy="group_offload", api_name="/text_to_video")
    assert "Plan: group_offload (" in status
    written = list(server["outputs"].rglob(Path(video).name))
    assert len(written) == 1
    sidecar = json.loads(written[0].with_suffix(".json").read_text())
    assert sidecar["plan"]["strategy"] == "group_offload"


def test_text_to_video_returns_a_video_and_timings(client, server):
    video, status, timings, seed, *_ = client.predict(*T2V, api_name="/text_to_video")
    frames, fps = read_video(video)
    assert frames.shape == (9, 64, 64, 3) and fps == 16
    assert seed == 7 and "Seed used: 7" in status and "self-test model" in status
    phases = [row[0] for row in timings["data"]]
    assert phases[:2] == ["Text encode", "Denoise"] or "Load (disk to RAM)" in phases
    assert phases[-1] == "Total"
    assert len(list(server["outputs"].rglob("*.mp4"))) >= 1


def test_the_models_tab_lists_models_and_refuses_to_delete_the_loaded_one(client, server, selftest_models_dir):
    client.predict(*T2V, api_name="/text_to_video")          # the self-test model is loaded from now on
    table, total, _ = client.predict(api_name="/models")
    rows = {row[0]: row for row in table["data"]}
    assert total.startswith(f"**{len(rows)} on disk, ") and "free for the models folder" in total
    assert rows["selftest-t2v"][1:3] == ["self-test model", "models folder"]
    assert rows["selftest-t2v"][3].endswith(("kB", "MB")) and "selftest-t2v" in rows["selftest-t2v"][4]
    said, *_ = client.predict("models:selftest-t2v", True, api_name="/delete_model")
    assert said.startswith("Not deleted: selftest-t2v is in use by the engine")
    said, *_ = client.predict("models:../../etc", True, api_name="/delete_model")
    assert "is not in the list of models" in said
    said, *_ = client.predict("models:selftest-i2v", False, api_name="/delete_model")
    assert said.startswith("Tick")
    assert (selftest_models_dir / "selftest-t2v" / "model_index.json").is_file()
    assert (selftest_models_dir / "selftest-i2v" / "model_index.json").is_file()


def test_the_system_panel_tells_of_a_job_shorter_than_its_refresh(client):
    """A job may start and end between two refreshes of the panel: idle, it says how the last one ended."""
    client.predict(*T2V, api_name="/text_to_image")
    pattern = r"Engine:\*\* idle · last job: done in [\d.]+ s \(ended \d+ s ago\) · `selftest-t2v` loaded \(CPU only\)"
    for _ in range(50):     # the stream's end and the result's arrival are not ordered
        panel = client.predict(api_name="/system")
        if re.search(pattern, panel):
            break
        time.sleep(0.1)
    assert re.search(pattern, panel), panel


def test_text_to_image_returns_a_png(client):
    image, status, _, seed, *_ = client.predict(*T2V, api_name="/text_to_image")
    assert Path(image).suffix == ".png" and seed == 7


def test_a_lora_in_the_models_folder_is_applied_and_recorded(client, server, selftest_models_dir):
    from safetensors.torch import save_file

    from tests.helpers.loras import diffusers_lora

    (selftest_models_dir / "loras").mkdir(exist_ok=True)
    save_file(diffusers_lora(), selftest_models_dir / "loras" / "page.safetensors")
    image, status, *_ = client.predict(*T2V, loras="page.safetensors: 0.5", api_name="/text_to_image")
    assert "LoRAs on: page.safetensors at 0.5 (1 file read from disk)." in status
    written = next(server["outputs"].rglob(Path(image).name))
    parameters = json.loads(written.with_suffix(".json").read_text())["parameters"]
    assert parameters["loras"] == [{"file": os.path.abspath(selftest_models_dir / "loras" / "page.safetensors"),
                                    "strength": 0.5, "expert": "both", "repo": None, "path": None}]
    with pytest.raises(Exception, match=re.escape("LoRA file '../page.safetensors' is a path outside the app's "
                                                  "models folder, which the page does not accept")):
        client.predict(*T2V, loras="../page.safetensors", api_name="/text_to_image")


def test_a_transformer_file_in_the_models_folder_is_used_and_a_path_outside_is_refused(client, server,
                                                                                      selftest_models_dir):
    """The page's Transformer file: a name is a file in models/transformers/ (here the self-test model's own
    transformer, written as one safetensors file in the original Wan layout); a path outside is refused before
    the job waits or loads anything."""
    from safetensors.torch import save_file

    from engine.models.selftest import SELFTEST_T2V
    from engine.models.single_file import PREFIX
    from tests.helpers.weights import original_state

    folder = selftest_models_dir / "transformers"
    folder.mkdir(exist_ok=True)
    file = folder / "page-t2v.safetensors"
    save_file({PREFIX + name: tensor for name, tensor in original_state(selftest_models_dir / SELFTEST_T2V).items()},
              str(file))
    image, status, *_ = client.predict(*T2V, transformer="page-t2v.safetensors", api_name="/text_to_image")
    sidecar = json.loads(next(server["outputs"].rglob(Path(image).name)).with_suffix(".json").read_text())
    assert sidecar["parameters"]["transformer"] == os.path.abspath(file)
    assert sidecar["plan"]["transformer_files"][0][0] == str(file.resolve())
    for outside in ("../../etc/passwd", "/etc/passwd", "~/x.gguf"):
        with pytest.raises(Exception, match=re.escape(f"The transformer file {outside!r} is a path outside the app's "
                                                      "models folder, which the page does not accept; put the file "
                                                      "in models/transformers/ and choose it by its name")):
            client.predict(*T2V, transformer=outside, api_name="/text_to_image")
    with pytest.raises(Exception, match=re.escape("The low-noise transformer file '/etc/x.gguf' is a path outside")):
        client.predict(*T2V, transformer_2="/etc/x.gguf", api_name="/text_to_image")


def test_image_to_video_with_an_upload(client, image_file):
    video, status, timings, _, *_ = client.predict(
        handle_file(str(image_file)), None, "selftest-i2v", "waves", "", "selftest-i2v", 96, 64, 9, 3, 5.0, 3.0, 1,
        api_name="/image_to_video")
    frames, _ = read_video(video)
    assert frames.shape == (9, 64, 96, 3)
    assert "Image encode" in [row[0] for row in timings["data"]]


@pytest.mark.parametrize("name, content, said", [
    ("bomb.png", "bomb", "Image 'bomb.png' is 900 megapixels, above the 80-megapixel limit; scale it down"),
    ("notes.png", b"this is text, not a picture", "Image 'notes.png' is not a readable image (not a known image "
                                                  "format); upload a PNG, JPEG or WebP image."),
])
def test_an_upload_that_cannot_be_used_is_named_with_what_to_do(client, log, tmp_path, name, content, said):
    from tests.helpers.images import png_claiming

    upload = tmp_path / name
    upload.write_bytes(png_claiming(30000, 30000) if content == "bomb" else content)
    with pytest.raises(Exception, match=re.escape(said)):
        client.predict(handle_file(str(upload)), None, "selftest-i2v", "waves", "", "selftest-i2v", 64, 64, 9, 3,
                       5.0, 3.0, 1, api_name="/image_to_video")
    said_there = log()
    assert "Traceback" not in said_there and "DecompressionBomb" not in said_there
    assert "UnidentifiedImageError" not in said_there


def test_the_console_has_the_app_s_lines_not_the_libraries(client, server, image_file):
    """An image-to-video run loads the image processor and the pipeline: neither says anything in the console."""
    client.predict(handle_file(str(image_file)), None, "selftest-i2v", "waves", "", "selftest-i2v", 64, 64, 5, 2,
                   5.0, 3.0, 1, api_name="/image_to_video")
    log = server["log"].read_text()
    assert "is running at" in log
    for noise in ("torchvision", "Loading pipeline components", "share=True", "it/s]"):
        assert noise not in log, f"{noise!r} in the console:\n{log}"


@pytest.mark.skipif(not Path("/proc/self/maps").is_file(), reason="reads the process's mapped files (Linux)")
def test_the_app_process_never_loads_torch_only_its_engine_does(client, server):
    """The page's process serves pages and passes messages: torch lives in the engine process alone. A value of
    torch's own type in an engine's answer (its version string was one) made the app import all of torch as it read
    the answer, about a second of CPU and 185 MB of the app's RAM."""
    client.predict(*t2v(4242, "a process without torch"), api_name="/text_to_video")
    client.predict(api_name="/system")
    client.predict(api_name="/history")
    mapped = Path(f"/proc/{server['proc'].pid}/maps").read_text()
    assert "libtorch" not in mapped
    assert "libtorch" in Path(f"/proc/{engine_pid(server)}/maps").read_text()   # the engine's, as it should

def test_bad_input_is_an_error_message(client):
    bad = list(T2V)
    bad[4] = 70
    with pytest.raises(Exception, match="Width 70 is not a multiple of 16, which selftest-t2v needs"):
        client.predict(*bad, api_name="/text_to_video")
    with pytest.raises(Exception, match="Image-to-video needs an image"):
        client.predict(None, None, "selftest-i2v", "waves", "", "selftest-i2v", 64, 64, 9, 3, 5.0, 3.0, 1,
                       api_name="/image_to_video")


def _call(server, api_name: str, body: str) -> str:
    """A raw API call (the JSON as given, NaN included), answered by the server's event stream."""
    import httpx

    url = server["url"] + f"gradio_api/call/{api_name}"
    posted = httpx.post(url, content=body, headers={"content-type": "application/json"}, timeout=10)
    assert posted.status_code == 200, posted.text
    return httpx.get(f"{url}/{posted.json()['event_id']}", timeout=60).text


@pytest.mark.parametrize("field, value, said", [
    (4, "NaN", "Width must be a whole number, got nan."),
    (6, "Infinity", "Frames must be a whole number, got inf."),
    (7, "12.5", "Steps must be a whole number, got 12.5."),
    (10, "7.25", "Seed must be a whole number, got 7.25."),
    (8, "[5]", "Guidance must be a number, got [5]."),
    (5, '"tall"', "Height must be a whole number, got 'tall'."),
    (1, "42", "The prompt must be text, got int."),
    (3, '"' + "m" * 300 + '"', "is 300 characters long, too long for a repo id or a folder"),
])
def test_values_an_api_client_sends_are_refused_with_the_app_s_own_sentence(server, log, field, value, said):
    """Never rounded, never a generic error: each wrong value is named with what to change."""
    import json as json_module

    from tests.helpers.api import OVERRIDES

    values = [json_module.dumps(v) for v in (*T2V, *OVERRIDES)]
    values[field] = value
    answer = _call(server, "text_to_video", '{"data": [' + ", ".join(values) + "]}")
    assert "event: error" in answer and said in answer, answer
    assert "Traceback" not in log()


def _wait_for_step(job, timeout=60):
    """Block until the streamed status shows denoising under way."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if any("Denoising: step" in str(output[1]) for output in job.outputs()):
            return
        assert not job.done(), "the job finished before it could be interrupted"
        time.sleep(0.05)
    raise AssertionError("the job never reached the denoising steps")


def _long_job():
    """A job that outlasts a few seconds of API calls on any machine (200 steps of the tiny model at 128x128x17
    once took 1.7 s in all on an idle CI machine: less than the test's pauses)."""
    long = list(T2V)
    long[4:8] = [256, 256, 33, 200]
    return long


def test_cancel_stops_the_job_and_the_next_one_runs(client, server):
    job = client.submit(*_long_job(), api_name="/text_to_video")
    _wait_for_step(job)
    client.predict(api_name="/cancel")
    _, status, _, _, *_ = job.result(timeout=60)
    assert "Cancelled during the denoising, after step" in status
    video, status, _, _, *_ = client.predict(*T2V, api_name="/text_to_video")
    assert "Done" in status and Path(video).exists()


def test_killed_engine_is_reported_and_replaced(client, server):
    job = client.submit(*_long_job(), api_name="/text_to_video")
    _wait_for_step(job)
    os.kill(engine_pid(server), signal.SIGKILL)
    with pytest.raises(Exception, match="engine process stopped unexpectedly during denoise"):
        job.result(timeout=60)
    video, status, _, _, *_ = client.predict(*T2V, api_name="/text_to_video")
    assert "Done" in status and Path(video).exists()


def test_sidecars_sit_beside_outputs(server):
    from engine.outputs.bundle import VIDEO_INPUT_SUFFIXES

    kept = tuple(VIDEO_INPUT_SUFFIXES.values())   # a video to video's input, an extension's source: no sidecar of their own
    made = [video for video in server["outputs"].rglob("*.mp4") if not video.name.endswith(kept)]
    assert made
    for video in made:
        sidecar = json.loads(video.with_suffix(".json").read_text())
        assert sidecar["file"] == video.name


def test_decode_again_tab_lists_failed_runs_and_decodes_them(client, server, selftest_models_dir, presets):
    """Latents left by a failed decode show up on the Decode again tab and become a video."""
    from engine.run.engine import Engine
    from tests.conftest import CPU, tiny_request
    from tests.faults import InjectedFaults

    failing = Engine(selftest_models_dir, CPU, faults=InjectedFaults({"vae_decode": 2}))
    failed = failing.run(tiny_request(presets, "selftest-t2v", server["outputs"], seed=31), "x", lambda e: None)
    assert failed.latents
    video, status = client.predict(failed.latents, api_name="/decode_again")
    frames, _ = read_video(video)
    assert frames.shape == (9, 64, 64, 3) and "Decoded again (tiled)" in status
    with pytest.raises(Exception, match="Pick saved latents from the list"):
        client.predict("/etc/passwd", api_name="/decode_again")
    # A finished run's kept latents are listed too, named so (app.py decode takes them), and decode into another video.
    from ui.tabs.decode_again import FINISHED, listing, pending_latents

    finished = Engine(selftest_models_dir, CPU).run(tiny_request(presets, "selftest-t2v", server["outputs"], seed=32,
                                                                 keep_latents=True), "y", lambda e: None)
    kept = next(path for label, path in pending_latents(str(server["outputs"])) if path.endswith(
        Path(finished.paths[0]).name.removesuffix(".mp4") + ".latents.safetensors"))
    label = dict((path, label) for label, path in pending_latents(str(server["outputs"])))[kept]
    assert label.endswith(f"({FINISHED})") and "of finished runs" in listing(str(server["outputs"]))[3]
    video, status = client.predict(kept, api_name="/decode_again")
    assert Path(video).name != Path(finished.paths[0]).name and "Decoded again" in status


def test_only_the_owner_can_cancel_a_running_job(client, server):
    job = client.submit(*_long_job(), api_name="/text_to_video")
    _wait_for_step(job)
    stranger = Client(server["url"], verbose=False)
    assert "only the person who started" in stranger.predict(api_name="/cancel")
    time.sleep(1.0)
    assert not job.done(), "a stranger's cancel stopped the job"
    assert "Cancelling" in client.predict(api_name="/cancel")
    _, status, _, _, *_ = job.result(timeout=60)
    assert "Cancelled during the denoising, after step" in status


def test_a_plain_json_call_with_a_prompt_and_steps_returns_an_image(server):
    import io

    import httpx
    from PIL import Image

    url = server["url"] + "gradio_api/call/generate_image"
    event = httpx.post(url, json={"data": ["cyberpunk city", 2]}, timeout=10).json()["event_id"]
    answer = httpx.get(f"{url}/{event}", timeout=120).text
    assert "event: complete" in answer, answer
    data = json.loads(answer.split("data: ", 1)[1].splitlines()[0])
    png = httpx.get(data[0]["url"], timeout=10)
    image = Image.open(io.BytesIO(png.content))
    assert image.format == "PNG" and image.size == (64, 64)   # the self-test preset's size
    sidecars = [json.loads(p.read_text()) for p in server["outputs"].rglob("*.json")]
    assert any(s["prompt"] == "cyberpunk city" and s["parameters"]["steps"] == 2 and s["mode"] == "t2i"
               for s in sidecars)


def test_a_raw_http_caller_may_leave_the_trailing_inputs_out_as_gradio_client_does(server, log):
    """The README's eleven values, or just a preset and a prompt: the server fills the rest with the API's own
    defaults; with no prompt at all, the app's sentence says what is missing."""
    import json as json_module

    for values in (T2V, ["selftest-t2v", "a red fox"]):
        answer = _call(server, "text_to_video", json_module.dumps({"data": values}))
        assert "event: complete" in answer and ".mp4" in answer, answer
    answer = _call(server, "text_to_video", json_module.dumps({"data": ["selftest-t2v"]}))
    assert "event: error" in answer and "The prompt is empty: describe what the video should show." in answer, answer
    assert "didn't receive enough input values" not in log()


def test_unload_with_nothing_loaded_says_so_at_once(client):
    client.predict(api_name="/unload")   # whatever an earlier test left loaded goes
    started = time.monotonic()
    assert client.predict(api_name="/unload") == "No model was loaded: nothing to unload."
    assert time.monotonic() - started < 3.0


def test_sigusr1_prints_every_thread_s_stack_on_the_console_and_the_app_serves_on(client, server, log):
    """What a report of a stuck app needs (README, Troubleshooting), without stopping it."""
    import urllib.request

    os.kill(server["proc"].pid, signal.SIGUSR1)
    deadline = time.time() + 10
    while time.time() < deadline and "Current thread" not in log():
        time.sleep(0.1)
    stacks = log()
    assert "Current thread" in stacks, stacks[-3000:]
    assert re.search(r'File ".*app\.py", line \d+ in serve', stacks), stacks[-3000:]   # the main thread, waiting
    assert server["proc"].poll() is None
    assert urllib.request.urlopen(server["url"], timeout=10).status == 200
