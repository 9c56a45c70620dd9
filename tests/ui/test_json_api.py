"""The JSON API on one real server with a password and two tokens: the README's curl examples as written, a job
made, followed and fetched, the refusals in sentences, logins and ownership, cancelling, the readings and the
schema."""
from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from engine.outputs.export import read_video
from tests.conftest import ROOT, running_app

pytestmark = pytest.mark.server

USER, PASSWORD = "wan", "a-long-secret-1"
TOKENS = ("token-of-alice-0123456789", "token-of-bob-9876543210xy")
JSON_TYPE = "application/json"
SMALL = {"model": "selftest-t2v", "width": 64, "height": 64, "frames": 9, "steps": 2}


@pytest.fixture(scope="module")
def server(tmp_path_factory, selftest_models_dir):
    folder = tmp_path_factory.mktemp("json-api")
    (folder / "tokens.txt").write_text("# the API's logins\n" + "\n".join(TOKENS) + "\n")
    outputs = folder / "outputs"
    with running_app(folder / "app.log", "--model", "selftest-t2v", "--outputs", str(outputs), "--models-dir",
                     str(selftest_models_dir), "--auth", f"{USER}:{PASSWORD}", "--api-token",
                     str(folder / "tokens.txt")) as (url, proc):
        yield {"url": url, "outputs": outputs, "log": folder / "app.log", "folder": folder}


def _client(server, login: str = "basic") -> httpx.Client:
    if login == "basic":
        return httpx.Client(base_url=server["url"], auth=(USER, PASSWORD), timeout=120)
    headers = {"Authorization": f"Bearer {TOKENS[0 if login == 'alice' else 1]}"} if login != "none" else {}
    return httpx.Client(base_url=server["url"], headers=headers, timeout=120)


def _wait(http: httpx.Client, job: str, states=("done", "failed", "cancelled"), timeout_s: float = 120) -> dict:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        said = http.get(f"/api/v1/jobs/{job}").json()
        if said["state"] in states:
            return said
        time.sleep(0.2)
    raise AssertionError(f"job {job} did not reach {states}: {said}")


def _readme_blocks() -> list[str]:
    """The bash blocks of the README's JSON API section."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## JSON API"):text.index("## Monitoring")]
    return re.findall(r"```bash\n(.*?)```", section, re.S)


def test_the_readme_s_curl_examples_work_as_written(server, tmp_path, image_file):
    blocks = _readme_blocks()
    assert len(blocks) == 2
    import shutil

    shutil.copy(image_file, tmp_path / "photo.png")
    env = {**os.environ, "APP": server["url"].rstrip("/"), "LOGIN": f"{USER}:{PASSWORD}"}
    first = subprocess.run(["bash", "-ec", blocks[0]], capture_output=True, text=True, cwd=tmp_path, env=env,
                           timeout=300)
    assert first.returncode == 0, first.stderr
    assert "event: JobFinished" in first.stdout and '"state":"' in first.stdout
    frames, fps = read_video(tmp_path / "fox.mp4")
    assert frames.shape == (9, 64, 64, 3) and fps == 16   # a real video, decoded
    assert '"schema"' in first.stdout   # the sidecar's first bytes
    second = subprocess.run(["bash", "-ec", blocks[1]], capture_output=True, text=True, cwd=tmp_path, env=env,
                            timeout=300)
    assert second.returncode == 0, second.stderr
    assert '{"image_base64":"iVBORw0KGgo' in second.stdout   # a PNG, in base64
    assert '"said":' in second.stdout                        # the cancel's answer


def test_a_job_through_the_api_its_events_result_and_sidecar(server):
    with _client(server) as http:
        made = http.post("/api/v1/jobs", json={"mode": "t2v", "prompt": "a kite", "seed": 5, **SMALL})
        assert made.status_code == 202, made.text
        job = made.json()
        assert set(job) >= {"id", "state", "place", "estimate_s", "links"}
        events = []
        with http.stream("GET", f"/api/v1/jobs/{job['id']}/events") as stream:
            assert stream.headers["content-type"].startswith("text/event-stream")
            for line in stream.iter_lines():
                if line.startswith("data: "):
                    events.append(json.loads(line[6:]))
        kinds = [event.get("type") for event in events]
        assert kinds[0] == "JobStarted" and "StepFinished" in kinds and kinds[-2] == "JobFinished"
        assert events[-1] == {"state": "done"}
        said = http.get(f"/api/v1/jobs/{job['id']}").json()
        assert said["state"] == "done" and said["seed"] == 5 and said["steps"] == 2 and said["ending"].startswith("done")
        assert {"denoise", "vae_decode"} <= set(said["timings"])
        video = http.get(f"/api/v1/jobs/{job['id']}/result")
        assert video.status_code == 200 and video.headers["content-type"] == "video/mp4"
        path = server["folder"] / "kite.mp4"
        path.write_bytes(video.content)
        assert read_video(path)[0].shape == (9, 64, 64, 3)
        sidecar = http.get(f"/api/v1/jobs/{job['id']}/sidecar").json()
        assert sidecar["seed"] == 5 and sidecar["prompt"] == "a kite"
        encoded = http.get(f"/api/v1/jobs/{job['id']}/result", params={"format": "base64"}).json()
        assert base64.b64decode(encoded["video_base64"]) == video.content and encoded["seed"] == 5
        # Files are named by their place in the outputs folder, never by the server's paths: in the status, the
        # events, the history.
        key = said["outputs"][0]
        assert re.fullmatch(r"\d{4}-\d\d-\d\d/[^/]+\.mp4", key) and (server["outputs"] / key).is_file(), key
        finished = next(event for event in events if event.get("type") == "JobFinished")
        assert finished["paths"] == [key] and finished["sidecar"] == key.removesuffix(".mp4") + ".json"
        entry = next(e for e in http.get("/api/v1/history").json() if e["key"] == key)
        assert entry["media"] == key and entry["sidecar"] == finished["sidecar"]
        disk = str(server["outputs"].resolve())
        for answer in (said, events, http.get("/api/v1/history").json()):
            assert disk not in json.dumps(answer)
        for limit, said in (("abc", "limit 'abc' is not a number of outputs: give a whole number from 1 to 1000"),
                            ("-1", "limit '-1' is not a number of outputs")):
            refused = http.get("/api/v1/history", params={"limit": limit})
            assert refused.status_code == 422 and refused.json()["error"].startswith(said), refused.text
        assert len(http.get("/api/v1/history", params={"limit": "1"}).json()) == 1


def test_images_go_in_as_uploads_or_in_base64(server, image_file):
    from PIL import Image

    with _client(server, "alice") as http:
        uploaded = http.post("/api/v1/jobs", data={"mode": "i2v", "preset": "selftest-i2v", "prompt": "waves",
                                                    "width": "64", "height": "48", "frames": "5", "steps": "2"},
                             files={"image": ("photo.png", image_file.read_bytes(), "image/png")})
        assert uploaded.status_code == 202, uploaded.text
        done = _wait(http, uploaded.json()["id"])
        assert done["state"] == "done", done
        data = base64.b64encode(image_file.read_bytes()).decode()
        still = http.post("/api/v1/jobs", json={"mode": "i2v", "preset": "selftest-i2v", "prompt": "waves",
                                                "image": f"data:image/png;base64,{data}", "width": 64, "height": 48,
                                                "frames": 5, "steps": 2})
        assert still.status_code == 202 and _wait(http, still.json()["id"])["state"] == "done"
        first = server["outputs"] / done["outputs"][0]     # a key of the outputs folder, as the History's
        kept = first.with_name(first.stem + ".first.png")
        assert Image.open(kept).size == Image.open(image_file).size   # the upload, kept as the run's input


def test_a_playlist_or_manifest_sent_as_a_video_is_refused_and_reads_nothing(server, tmp_path):
    """A DASH manifest in base64 as the video to remake, an HLS playlist uploaded by its .m3u8 name as the video to
    extend: each names a video outside the app's folders; refused with the app's sentence, nothing made."""
    from tests.helpers.containers import dash, hls, video

    secret = video(tmp_path / "private" / "secret.mp4")
    before = sorted(server["outputs"].rglob("*.mp4"))
    with _client(server, "alice") as http:
        mpd = base64.b64encode(dash(secret).encode()).decode()
        remade = http.post("/api/v1/jobs", json={"mode": "v2v", "prompt": "x", "video": mpd, "model": "selftest-t2v",
                                                 "width": 64, "height": 64, "frames": 5, "steps": 2})
        extended = http.post("/api/v1/jobs", data={"mode": "i2v", "preset": "selftest-i2v", "prompt": "x",
                                                   "frames": "5", "steps": "2"},
                             files={"extend": ("clip.m3u8", hls(secret).encode(), "application/vnd.apple.mpegurl")})
    for answer, said in ((remade, "is a DASH manifest"), (extended, "is an HLS playlist")):
        assert answer.status_code == 422, answer.text
        assert said in answer.json()["error"] and "names other files" in answer.json()["error"]
    assert sorted(server["outputs"].rglob("*.mp4")) == before


@pytest.mark.parametrize("body, said", [
    ({"mode": "t2v", **SMALL}, "The prompt is empty: describe what the video should show."),
    ({"prompt": "x", "guidance": float("nan"), **SMALL}, "Guidance must be a number, got nan."),
    ({"prompt": "x", **SMALL, "width": "wide"}, "Width must be a whole number, got 'wide'."),
    ({"prompt": "x", "colour": "red"}, "'colour' is not a field of a text to video job"),
    ({"prompt": "x", **SMALL, "width": 70}, "Width 70 is not a multiple of 16"),
    ({"prompt": "x", "mode": "i2v", "preset": "selftest-i2v", "image": "not base64!"}, "The image is not base64"),
])
def test_bad_bodies_get_422_with_the_app_s_sentence_before_any_work(server, body, said):
    before = sorted(server["outputs"].rglob("*.mp4"))
    with _client(server) as http:
        answer = http.post("/api/v1/jobs", content=json.dumps(body), headers={"Content-Type": "application/json"})
    assert answer.status_code == 422, answer.text
    assert said in answer.json()["error"] and all(isinstance(p, str) for p in answer.json()["problems"])
    assert sorted(server["outputs"].rglob("*.mp4")) == before


def test_an_oversized_body_or_a_key_twice_is_refused_in_a_sentence(server):
    with _client(server) as http:
        huge = http.post("/api/v1/jobs", content=b'{"prompt": "' + b"a" * (73 * 1024 * 1024) + b'"}',
                         headers={"Content-Type": "application/json"})
        assert huge.status_code == 413 and "more than the 75 MB a job with its files may send" in huge.json()["error"]
        long_prompt = http.post("/api/v1/jobs", json={"prompt": "a" * 5000, **SMALL})
        assert long_prompt.status_code == 422 and "keep it under 4000" in long_prompt.json()["error"]
        twice = http.post("/api/v1/jobs", content=b'{"prompt": "a", "prompt": "b"}',
                          headers={"Content-Type": "application/json"})
        assert twice.status_code == 422 and "names 'prompt' twice" in twice.json()["error"]


def test_a_login_is_needed_and_a_job_is_its_login_s_own(server):
    with _client(server, "none") as anonymous:
        refused = anonymous.post("/api/v1/jobs", json={"prompt": "x"})
        assert refused.status_code == 401 and refused.headers["www-authenticate"].startswith("Basic")
        assert "Log in first" in refused.json()["error"]
    with httpx.Client(base_url=server["url"], auth=(USER, "wrong"), timeout=30) as wrong:
        assert wrong.get("/api/v1/presets").status_code == 401
    with _client(server, "alice") as alice, _client(server, "bob") as bob, _client(server) as basic:
        job = alice.post("/api/v1/jobs", json={"prompt": "alice's fox", **SMALL}).json()["id"]
        assert _wait(alice, job)["state"] == "done"
        for other in (bob, basic):
            for method, path in (("GET", ""), ("GET", "/result"), ("GET", "/sidecar"), ("GET", "/events"),
                                 ("DELETE", "")):
                answer = other.request(method, f"/api/v1/jobs/{job}{path}")
                assert answer.status_code == 404 and "There is no job" in answer.json()["error"], (method, path)
            assert job not in [j["id"] for j in other.get("/api/v1/jobs").json()]
        assert job in [j["id"] for j in alice.get("/api/v1/jobs").json()]
        evil = alice.post("/api/v1/jobs", json={"prompt": "x"}, headers={"Origin": "http://evil.example"})
        assert evil.status_code == 403   # another web page's request, as on the page


def test_delete_cancels_a_running_job_and_takes_a_waiting_one_out(server):
    with _client(server, "bob") as http:
        long = http.post("/api/v1/jobs", json={"prompt": "a long walk", **SMALL, "width": 256, "height": 256,
                                               "frames": 33, "steps": 200}).json()["id"]
        _wait(http, long, ("running",))
        waiting = http.post("/api/v1/jobs", json={"prompt": "next", **SMALL}).json()
        assert waiting["state"] == "waiting" and waiting["place"] >= 1
        out = http.delete(f"/api/v1/jobs/{waiting['id']}").json()
        assert out["said"].startswith("taken out of the queue") and out["state"] == "cancelled"
        deadline = time.time() + 60
        while http.get(f"/api/v1/jobs/{long}").json()["step"] < 1 and time.time() < deadline:
            time.sleep(0.2)
        stop = http.delete(f"/api/v1/jobs/{long}").json()
        assert stop["said"].startswith("cancelling")
        ended = _wait(http, long)
        assert ended["state"] == "cancelled" and ended["ending"].startswith("cancelled during the denoising")
        assert http.get(f"/api/v1/jobs/{long}/result").status_code == 409
        assert http.get(f"/api/v1/jobs/{waiting['id']}").json()["state"] == "cancelled"


def test_the_readings_the_plan_and_the_schema(server):
    with _client(server) as http:
        presets = {p["name"]: p for p in http.get("/api/v1/presets").json()}
        assert presets["selftest-t2v"]["settings"]["width"] == 64 and presets["selftest-i2v"]["mode"] == "i2v"
        models = {m["name"] for m in http.get("/api/v1/models").json()}
        assert {"selftest-t2v", "selftest-i2v"} <= models
        history = http.get("/api/v1/history", params={"limit": 2}).json()
        assert len(history) <= 2 and all("key" in entry for entry in history)
        assert http.get("/api/v1/history", params={"limit": "abc"}).status_code == 422
        plan = http.post("/api/v1/plan", json={"preset": "selftest-t2v", "width": 128, "frames": 17}).json()
        assert plan["fits"] is True and plan["settings"]["width"] == 128 and plan["phases"]
        bad = http.post("/api/v1/plan", json={"preset": "selftest-t2v", "width": 70})
        assert bad.status_code == 422 and "multiple of 16" in bad.json()["error"]
        schema = http.get("/api/openapi.json").json()
        body = schema["paths"]["/v1/jobs"]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert {"prompt", "width", "loras", "strength", "extend", "vae_precision"} <= set(body["properties"])
        assert body["additionalProperties"] is False
        assert {"/v1/jobs/{job_id}", "/v1/jobs/{job_id}/events", "/v1/plan"} <= set(schema["paths"])
        docs = http.get("/api/docs")
        assert docs.status_code == 200 and "swagger" in docs.text.lower()


# What a caller may send instead of a field's value: wrong types, numbers past every range (beyond a float's, beyond
# Python's 4300-digit parse), not-a-number spellings, nested values, a digit that is no ASCII digit.
ODD_VALUES = [["t2v"], {"a": 1}, [[[]]], 10**400, -(10**400), 2**63, -1, 0, 1e-320, "nan", "inf", "-1e999", "²",
              "9" * 5000, True, None, ""]


def _no_500(answer: httpx.Response, where: str) -> None:
    assert answer.status_code < 500, f"{where}: {answer.status_code} {answer.text[:300]}"
    if answer.status_code >= 400:
        said = answer.json().get("error")
        assert isinstance(said, str) and said and "Traceback" not in answer.text, f"{where}: {answer.text[:300]}"


def test_no_body_gets_a_500_whatever_each_field_holds(server):
    """Every field of the job's schema, on the plan and on a job (whose empty prompt, or too narrow a width, keeps it
    out of the queue), with each odd value: the app's sentence, never a server error."""
    with _client(server) as http:
        schema = http.get("/api/openapi.json").json()
        fields = schema["paths"]["/v1/jobs"]["post"]["requestBody"]["content"]["application/json"]["schema"]
        for name in sorted(fields["properties"]):
            for value in ODD_VALUES:
                where = f"{name}={str(value)[:30]!r}"
                body = json.dumps({"preset": "selftest-t2v", name: value}).encode()
                _no_500(http.post("/api/v1/plan", content=body, headers={"Content-Type": JSON_TYPE}), f"plan {where}")
                kept_out = {"prompt": ""} if name != "prompt" else {"width": 70}     # refused whatever the value
                job = json.dumps({**kept_out, **({"mode": "t2v"} if name != "mode" else {}), name: value}).encode()
                answer = http.post("/api/v1/jobs", content=job, headers={"Content-Type": JSON_TYPE})
                _no_500(answer, f"jobs {where}")
                assert answer.status_code != 202, where
        huge = b'{"prompt": "x", "width": ' + b"9" * 5000 + b"}"     # past Python's digit limit, as parsed
        _no_500(http.post("/api/v1/jobs", content=huge, headers={"Content-Type": JSON_TYPE}), "5000 digits")


def test_no_call_of_the_page_s_functions_gets_a_silent_error_whatever_each_input_holds(server):
    """Every input of every function the page names (its gradio API), each given two of the odd values in turn
    (every value reaches about 20 inputs), with the prompt empty so no job runs: an answer, a refusal in the app's
    sentence or gradio's own for a value of the wrong shape, never {"error": null} (an exception the caller is not
    told of) and no traceback in the console."""
    from concurrent.futures import ThreadPoolExecutor

    tracebacks = server["log"].read_text().count("Traceback")
    with httpx.Client(base_url=server["url"], timeout=60) as http:
        assert http.post("/login", data={"username": USER, "password": PASSWORD}).status_code == 200
        endpoints = http.get("/gradio_api/info").json()["named_endpoints"]
        calls = []
        for name, endpoint in endpoints.items():
            if name in ("/download_model", "/unload"):     # a download, or the loaded model let go: not fuzzed
                continue
            params = [p["parameter_name"] for p in endpoint["parameters"]]
            for number, param in enumerate(params):
                for offset in (0, 8):
                    values = {"prompt": ""} if param != "prompt" else {"width": 70}
                    values[param] = ODD_VALUES[(number + offset + len(calls)) % len(ODD_VALUES)]
                    calls.append((name, param, [values.get(p) for p in params]))

        def call(job) -> str | None:
            name, param, data = job
            posted = http.post(f"/gradio_api/call{name}", content=json.dumps({"data": data}).encode(),
                               headers={"Content-Type": JSON_TYPE})
            if posted.status_code >= 500:
                return f"{name} {param}: {posted.status_code}"
            if posted.status_code != 200:
                return None if "detail" in posted.json() else f"{name} {param}: {posted.text[:200]}"
            answer = http.get(f"/gradio_api/call{name}/{posted.json()['event_id']}").text
            return f"{name} {param}: {answer[:200]}" if '"error": null' in answer else None

        with ThreadPoolExecutor(4) as pool:
            silent = [said for said in pool.map(call, calls) if said]
    assert len(calls) > 300 and silent == [], silent[:10]
    assert server["log"].read_text().count("Traceback") == tracebacks


def test_odd_headers_get_the_app_s_answer_not_a_500(server):
    with httpx.Client(base_url=server["url"], timeout=60) as http:
        letters = http.get("/api/v1/jobs", headers={"Authorization": "Bearer ééé".encode("utf-8")})
        assert letters.status_code == 401 and "error" in letters.json()
    with _client(server, "alice") as http:
        made = http.post("/api/v1/jobs", json={"prompt": "a short one", **SMALL})
        assert made.status_code == 202, made.text
        job = made.json()["id"]
        _wait(http, job)
        for resume in ("²", "9" * 5000, "-3", "2.5", "1e3"):
            with http.stream("GET", f"/api/v1/jobs/{job}/events", headers={"Last-Event-ID": resume.encode("utf-8")}) as events:
                assert events.status_code == 200, resume
                assert "event: end" in "".join(events.iter_text()), resume


def test_a_raw_page_call_naming_a_file_never_uploaded_is_told_to_upload_it(server, tmp_path):
    """gradio answers such a call {"error": null}, with a traceback in the console: the guard answers first."""
    never = tmp_path / "never-uploaded.png"
    never.write_bytes(b"not uploaded")
    with httpx.Client(base_url=server["url"], timeout=60) as http:
        assert http.post("/login", data={"username": USER, "password": PASSWORD}).status_code == 200
        for path in (str(never), "/etc/passwd", "relative/nothing.png"):
            image = {"path": path, "meta": {"_type": "gradio.FileData"}}
            answer = http.post("/gradio_api/call/image_to_video", json={"data": [image, None, "selftest-i2v", "x"]})
            assert answer.status_code == 400, answer.text
            assert answer.json()["detail"] == (
                f"The file {Path(path).name!r} was not uploaded to this app, which takes only files uploaded to it: "
                "upload it first (POST /gradio_api/upload, or gradio_client's handle_file), then send the path that "
                "upload answered with.")
    assert "InvalidPathError" not in server["log"].read_text()


LONG = {**SMALL, "width": 256, "height": 256, "frames": 33, "steps": 200}   # minutes on this CPU: cancelled


def test_one_login_holds_at_most_half_the_queue_and_the_other_logins_still_get_in(server):
    """16 places (the default), 8 a login: a token's ninth waiting job is refused saying why; another token and a
    page login (gradio's API, signed in) still get places, and the page login's own share is held the same way."""
    from gradio_client import Client

    page = Client(server["url"], auth=(USER, PASSWORD), verbose=False)
    with _client(server, "alice") as alice, _client(server, "bob") as bob:
        running = alice.post("/api/v1/jobs", json={"prompt": "a long walk", **LONG}).json()["id"]
        _wait(alice, running, ("running",))
        mine = [alice.post("/api/v1/jobs", json={"prompt": f"fox {n}", **SMALL}).json() for n in range(8)]
        try:
            assert [job["state"] for job in mine] == ["waiting"] * 8
            refused = alice.post("/api/v1/jobs", json={"prompt": "one more", **SMALL})
            assert refused.status_code == 429, refused.text
            assert refused.json()["error"].startswith(
                "The queue is full for your login: 8 of your jobs are waiting, the most one login may have waiting "
                "(8 of the queue's 16 places; the rest stay open to other logins).")
            theirs = bob.post("/api/v1/jobs", json={"prompt": "bob's fox", **SMALL}).json()
            assert theirs["state"] == "waiting" and theirs["place"] == 9
            assert bob.delete(f"/api/v1/jobs/{theirs['id']}").json()["state"] == "cancelled"
            args = ["selftest-t2v", "a page fox", "", "selftest-t2v", 64, 64, 9, 2, 5.0, 3.0]
            page_jobs = [page.submit(*args, seed, api_name="/text_to_video") for seed in range(8)]
            deadline = time.time() + 60
            while len([j for j in alice.get("/api/v1/jobs").json() if j["state"] == "waiting"]) < 8 or \
                    "16 waiting" not in page.predict(api_name="/system"):
                assert time.time() < deadline, page.predict(api_name="/system")
                time.sleep(0.2)
            alice.delete(f"/api/v1/jobs/{mine[0]['id']}")    # a place is free: not for the page login's ninth
            with pytest.raises(Exception, match="The queue is full for your login: 8 of your jobs are waiting"):
                page.predict(*args, 99, api_name="/text_to_video")
            assert "8 waiting jobs were taken out" in page.predict(api_name="/cancel")
            assert {job.result(timeout=30)[1] for job in page_jobs} == {
                "**Taken out of the queue: it did not run, and the earlier result is kept.**"}
        finally:
            for job in mine:
                alice.delete(f"/api/v1/jobs/{job['id']}")
            alice.delete(f"/api/v1/jobs/{running}")
            _wait(alice, running)


def test_a_job_predicted_past_an_hour_is_refused_with_its_numbers_on_a_server_with_a_password(server):
    """A password server's ceiling is 60 minutes by default: with this machine measured (here made 10^6 times
    slower than it is), a job of 16 videos is refused before it waits, through the JSON API and the page's API,
    and its plan says so; the ceiling comes down from an hour only when the machine's speed says the job is long."""
    from gradio_client import Client

    from engine.device.calibrate import CALIBRATION_FILE
    from engine.device.hardware import detect_hardware
    from tests.helpers.machines import slow_calibration

    slow_calibration(server["outputs"], 1e6, detect_hardware())   # the server's engine sees this machine
    big = {**SMALL, "count": 16, "interpolate": 2}
    try:
        with _client(server, "bob") as bob:
            refused = bob.post("/api/v1/jobs", json={"prompt": "sixteen foxes", **big})
            if refused.status_code == 202:
                bob.delete(f"/api/v1/jobs/{refused.json()['id']}")
            assert refused.status_code == 422, refused.text
            said = refused.json()["error"]
            assert said.startswith("This job is predicted to take about ") and "16 videos of about" in said, said
            assert "One job may take at most 60 min on this server (its --max-job-minutes): ask for fewer videos " \
                   "(count), fewer frames, steps or pixels, or leave out the smoother." in said
            assert not [job for job in bob.get("/api/v1/jobs").json() if job["state"] in ("waiting", "running")]
            plan = bob.post("/api/v1/plan", json=big).json()
            assert plan["too_long"] == said and plan["job_seconds"] > 3600, plan
        page = Client(server["url"], auth=(USER, PASSWORD), verbose=False)
        with pytest.raises(Exception, match="This job is predicted to take about .* 16 videos of about"):
            page.predict("selftest-t2v", "sixteen foxes", "", "selftest-t2v", 64, 64, 9, 2, 5.0, 3.0, 1, count=16,
                         interpolate=2, api_name="/text_to_video")
    finally:
        (server["outputs"] / CALIBRATION_FILE).unlink()


def test_wrong_passwords_and_tokens_are_slowed_down_as_on_the_page(server):
    """(Last in this file: the address waits a moment afterwards.)"""
    answers = []
    with httpx.Client(base_url=server["url"], timeout=30) as http:
        for number in range(7):
            headers = {"Authorization": "Bearer not-a-token-at-all-000"} if number % 2 else {}
            answers.append(http.get("/api/v1/presets", headers=headers,
                                    auth=None if number % 2 else (USER, f"wrong-{number}")).status_code)
        assert answers[:5] == [401] * 5 and answers[-1] == 429
        refused = http.get("/api/v1/presets", auth=(USER, PASSWORD))
        assert refused.status_code == 429 and "wait" in refused.json()["error"]   # the right one too, meanwhile
        time.sleep(float(re.search(r"wait (\d+) s", refused.json()["error"]).group(1)) + 0.5)
        assert http.get("/api/v1/presets", auth=(USER, PASSWORD)).status_code == 200


def test_the_throttle_counts_the_connection_s_own_address_not_what_a_header_claims(server):
    """Wrong passwords sent from 127.0.0.1, each claiming another X-Forwarded-For, are counted together (they are
    not spread over 20 addresses), and those claiming 127.0.0.2 do not lock out a caller really at 127.0.0.2. (After
    the test above in this file: it waits for this address again at its end.)"""
    answers = []
    with httpx.Client(base_url=server["url"], timeout=30) as http:
        for number in range(7):
            answers.append(http.get("/api/v1/presets", auth=(USER, f"wrong-{number}"),
                                    headers={"X-Forwarded-For": f"10.0.0.{number}" if number % 2 else "127.0.0.2"})
                           .status_code)
        assert answers[:5] == [401] * 5 and answers[-1] == 429
        other = httpx.Client(base_url=server["url"], timeout=30,
                             transport=httpx.HTTPTransport(local_address="127.0.0.2"))
        with other:
            assert other.get("/api/v1/presets", auth=(USER, PASSWORD)).status_code == 200
        refused = http.get("/api/v1/presets", auth=(USER, PASSWORD))
        assert refused.status_code == 429
        time.sleep(float(re.search(r"wait (\d+) s", refused.json()["error"]).group(1)) + 0.5)
        assert http.get("/api/v1/presets", auth=(USER, PASSWORD)).status_code == 200


def _raw(server, request: bytes, body_chunks=()) -> tuple[int, bytes, int]:
    """(the status, the answer, the bytes of body sent before the answer came) of one request written by hand."""
    import socket
    from urllib.parse import urlsplit

    where = urlsplit(server["url"])
    with socket.create_connection((where.hostname, where.port), timeout=30) as connection:
        connection.sendall(request)
        sent = 0
        connection.settimeout(0.5)
        for chunk in body_chunks:
            try:
                connection.sendall(chunk)
                sent += len(chunk)
                answered = connection.recv(65536, socket.MSG_PEEK)
            except (socket.timeout, BlockingIOError):
                continue
            except (BrokenPipeError, ConnectionResetError):
                break
            if answered:
                break
        connection.settimeout(30)
        answer = b""
        while b"\r\n\r\n" not in answer or len(answer.split(b"\r\n\r\n", 1)[1]) < _length(answer):
            piece = connection.recv(65536)
            if not piece:
                break
            answer += piece
    return int(answer.split(b" ", 2)[1]), answer, sent


def _length(answer: bytes) -> int:
    found = re.search(rb"(?i)\r\ncontent-length: *(\d+)", answer)
    return int(found.group(1)) if found else 0


def test_a_body_in_chunks_is_refused_before_it_is_read_whatever_length_it_claims(server):
    """The probe's way past the limits: Content-Length 10 beside Transfer-Encoding: chunked, then megabytes of
    chunks, to the plan, a job and the page's upload. Each is refused (411) before its chunks are taken in."""
    credentials = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    megabyte = b"100000\r\n" + b"a" * 0x100000 + b"\r\n"
    for path, kind in (("/api/v1/plan", "application/json"), ("/api/v1/jobs", "application/json"),
                       ("/gradio_api/upload", "multipart/form-data; boundary=x")):
        head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Basic {credentials}\r\n"
                f"Content-Type: {kind}\r\nContent-Length: 10\r\nTransfer-Encoding: chunked\r\n\r\n").encode()
        status, answer, sent = _raw(server, head, [megabyte] * 150)
        assert status == 411 and b"not in chunks" in answer, (path, answer[:300])
        assert sent < 150 * len(megabyte), path      # answered long before the 150 MB were sent
