"""What a caller of the page or the raw API can reach on the server: model folders, files, uploads.

Every request goes to 127.0.0.1, to an app started as a user starts it.
"""
from __future__ import annotations

import http.client
import json
import os
import shutil
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from gradio_client import Client

from tests.conftest import ROOT, running_app, selftest_app
from tests.helpers.api import I2V_TAIL, OVERRIDES, call_api
from ui.context import ALLOW_PATHS_HINT

pytestmark = pytest.mark.server

T2V = ["selftest-t2v", "a red fox", "", "selftest-t2v", 64, 64, 9, 2, 5.0, 3.0, 7]
PASSWD = Path("/etc/passwd")


@pytest.fixture(scope="module")
def models_folder(tmp_path_factory, selftest_models_dir, model_dirs) -> Path:
    """A models folder with the self-test models and one more Wan folder, 'my-wan', inside it."""
    folder = tmp_path_factory.mktemp("sec-models")
    for name in os.listdir(selftest_models_dir):
        shutil.copytree(selftest_models_dir / name, folder / name)
    shutil.copytree(model_dirs["tiny-t2v"], folder / "my-wan")
    return folder


@pytest.fixture(scope="module")
def app(tmp_path_factory, models_folder):
    """The app with its default settings (model paths refused)."""
    with selftest_app(tmp_path_factory, models_folder, "sec") as app:
        yield app


@pytest.fixture(scope="module")
def client(app):
    return Client(app["url"], verbose=False)


def _outputs_files(app) -> set[Path]:
    return set(app["outputs"].rglob("*"))


def _t2v(model: str, seed: int = 7) -> list:
    args = list(T2V)
    args[3], args[10] = model, seed
    return args


# ----- 1. model references ---------------------------------------------------
@pytest.fixture
def models_here(tmp_path, monkeypatch) -> Path:
    """A working folder holding models/my-wan, models/linked (a link to a folder elsewhere) and org/name."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models" / "my-wan").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "org" / "name").mkdir(parents=True)
    try:
        (tmp_path / "models" / "linked").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    except OSError:   # no symlinks for this user (Windows without developer mode)
        pass
    return tmp_path / "models"


def test_which_model_references_the_page_accepts(models_here):
    from engine.errors import ModelError
    from ui.context import checked_model_ref

    inside = str((models_here / "my-wan").absolute())
    accepted = {"selftest-t2v": "selftest-t2v", "selftest-i2v": "selftest-i2v",
                "Wan-AI/Wan2.1-T2V-1.3B-Diffusers": "Wan-AI/Wan2.1-T2V-1.3B-Diffusers",
                " my-wan ": inside, "my-wan": inside, inside: inside, "models/my-wan": inside,
                "./models/my-wan": inside, "": ""}
    if (models_here / "linked").is_symlink():
        accepted["linked"] = str(models_here / "linked")   # the operator's own link inside models/
    for ref, expected in accepted.items():
        assert checked_model_ref(ref, models_here) == expected, ref
    for ref in ["/etc", "../etc", "..", ".", "~", "~/x", "~root", "org/name", "./org/name", str(models_here.parent),
                "models/../org/name", "models/my-wan/../../org", "models\\..\\org", "C:\\models", "elsewhere",
                str(models_here / ".." / "elsewhere"), "/no/such/folder"]:
        with pytest.raises(ModelError, match=ALLOW_PATHS_HINT):
            checked_model_ref(ref, models_here)
    # Markup, addresses and scheme-relative paths name no model: refused before they are shown anywhere.
    for ref in ["**bold**", "<img src=x>", "![i](x.png)", "//evil.example/x.png", "http://evil.example/x"]:
        with pytest.raises(ModelError):
            checked_model_ref(ref, models_here)
    # --allow-model-paths, and what the operator chose (--model, presets), pass unchanged.
    assert checked_model_ref("/etc", models_here, allow_paths=True) == "/etc"
    assert checked_model_ref("~/wan", models_here, trusted=("~/wan",)) == "~/wan"


def test_the_context_checks_against_its_models_folder(models_here, presets):
    from engine.errors import ModelError
    from engine.service.worker import WorkerClient
    from ui.context import AppContext

    ctx = AppContext(WorkerClient(models_here), presets, "outputs", "/opt/wan")
    assert ctx.model_ref("my-wan") == str((models_here / "my-wan").absolute())
    assert ctx.model_ref("/opt/wan") == "/opt/wan"                     # the --model it was started with
    assert ctx.model_ref(presets["wan21-t2v-1.3b"].settings.model) == presets["wan21-t2v-1.3b"].settings.model
    with pytest.raises(ModelError):
        ctx.model_ref("/opt/other")
    assert AppContext(WorkerClient(models_here), presets, "outputs", allow_model_paths=True).model_ref("/x") == "/x"


@pytest.mark.parametrize("ref", ["/etc", "../../etc", "~/x", "/no/such/folder", "tests/ui", "models/../../etc",
                                 "selftest-t2v/../../etc"])
def test_a_model_path_outside_the_models_folder_is_refused_before_any_work(client, app, ref):
    before = _outputs_files(app)
    with pytest.raises(Exception) as raised:
        client.predict(*_t2v(ref), api_name="/text_to_video")
    message = str(raised.value)
    assert ALLOW_PATHS_HINT in message, message
    assert "is a path outside the app's models folder" in message
    assert _outputs_files(app) == before


def test_the_other_endpoints_refuse_a_model_path_too(client, app, image_file):
    from gradio_client import handle_file

    with pytest.raises(Exception, match="--allow-model-paths"):
        client.predict(*_t2v("/etc"), api_name="/text_to_image")
    i2v = list(I2V_TAIL)
    i2v[3] = str(Path.home())
    with pytest.raises(Exception, match="--allow-model-paths"):
        client.predict(handle_file(str(image_file)), None, *i2v, api_name="/image_to_video")


def test_repo_ids_reach_the_engine_unchanged(client):
    # Offline, an uncached repo id gets the engine's own message, not the path refusal.
    with pytest.raises(Exception) as raised:
        client.predict(*_t2v("nobody/no-such-wan-model"), api_name="/text_to_video")
    assert "--allow-model-paths" not in str(raised.value)
    assert "nobody/no-such-wan-model" in str(raised.value)


def test_a_folder_inside_the_models_folder_works_by_name_and_by_path(client, models_folder):
    video, status, _, seed, *_ = client.predict(*_t2v("my-wan", seed=11), api_name="/text_to_video")
    assert Path(video).exists() and seed == 11 and "Done" in status
    video, _, _, seed, *_ = client.predict(*_t2v(str(models_folder / "my-wan"), seed=12), api_name="/text_to_video")
    assert Path(video).exists() and seed == 12


# The one answer for a model reference that is not accepted (the page's, before any work: never the Hub's).
def _refusal(ref: str) -> str:
    return (f"model {ref!r} is a path outside the app's models folder, which the page does not accept; use a Hugging "
            f"Face repo id (org/name), selftest-t2v or selftest-i2v, or a folder inside the models folder, or "
            f"{ALLOW_PATHS_HINT}")


RELATIVE = ["app.py", "nothere.py", "engine/models", "engine/nothere", "../x", "tests/ui", "ui/../app.py"]


def test_a_relative_path_gets_one_sentence_whether_it_exists_or_not(monkeypatch, models_here):
    """In the app's folder, app.py and engine/models exist and nothere.py and engine/nothere do not: the answers
    once differed ("a path outside", "neither a repo id", a Hub lookup) and so told what is on the disk."""
    from engine.errors import ModelError
    from ui.context import checked_model_ref

    monkeypatch.chdir(ROOT)
    assert (ROOT / "app.py").is_file() and (ROOT / "engine" / "models").is_dir()
    for ref in RELATIVE:
        with pytest.raises(ModelError) as raised:
            checked_model_ref(ref, models_here)
        assert str(raised.value) == _refusal(ref)
    # A repo id whose first name is nothing in the working folder is a repo id, and reaches the engine unchanged.
    assert checked_model_ref("nobody/no-such-wan-model", models_here) == "nobody/no-such-wan-model"


@pytest.mark.parametrize("ref", RELATIVE)
def test_the_page_answers_a_relative_path_before_any_work_and_without_asking_the_hub(client, app, ref):
    before = _outputs_files(app)
    with pytest.raises(Exception) as raised:
        client.predict(*_t2v(ref), api_name="/text_to_video")
    message = str(raised.value)
    assert f"The model cannot be used: {_refusal(ref)}." in message, message
    assert "Hugging Face cache" not in message and str(ROOT) not in message
    assert _outputs_files(app) == before


def test_with_allow_model_paths_a_folder_outside_models_works(tmp_path, models_folder, model_dirs):
    outside = model_dirs["tiny-t2v"]
    assert models_folder not in outside.parents
    with running_app(tmp_path / "app.log", "--allow-model-paths", "--outputs", str(tmp_path / "out"),
                     "--models-dir", str(models_folder)) as (url, _):
        client = Client(url, verbose=False)
        video, status, _, seed, *_ = client.predict(*_t2v(str(outside), seed=5), api_name="/text_to_video")
        assert Path(video).exists() and seed == 5 and "Done" in status
        sidecar = json.loads(next((tmp_path / "out").rglob("*.json")).read_text())
        assert sidecar["model"]["ref"] == str(outside)
        # Still the engine's own checks: a folder that is not a model is explained, not crashed on.
        with pytest.raises(Exception, match="model_index.json"):
            client.predict(*_t2v(str(tmp_path)), api_name="/text_to_video")


# ----- 2. file paths through the API -------------------------------------------
def _config(app) -> dict:
    return httpx.get(app["url"] + "config", timeout=10).json()


def _fn_index(app, api_name: str) -> int:
    for dep in _config(app)["dependencies"]:
        if dep.get("api_name") == api_name:
            return dep["id"]
    raise AssertionError(f"no endpoint {api_name}")


def _queue_join(app, api_name: str, data: list, timeout: float = 60) -> str:
    """Everything the server sends back for one call through /queue/join, as the page makes it."""
    session = uuid.uuid4().hex[:11]
    base = app["url"] + "gradio_api/"
    with httpx.Client(timeout=timeout) as http:
        joined = http.post(base + "queue/join", json={
            "data": data, "fn_index": _fn_index(app, api_name), "session_hash": session,
            "event_data": None, "trigger_id": None})
        text = joined.text
        if joined.status_code != 200:
            return text
        deadline = time.time() + timeout
        with http.stream("GET", base + "queue/data", params={"session_hash": session}) as stream:
            for line in stream.iter_lines():
                text += line + "\n"
                if '"process_completed"' in line or time.time() > deadline:
                    break
    return text


def _server_files(secret_file) -> list[tuple[str, str]]:
    """(path as a caller writes it, text that must never come back)."""
    path, marker = secret_file
    files = [(str(path), marker), (str(ROOT / "ui" / "startup.py"), "def resolve_auth")]
    if PASSWD.is_file():
        files.append(("/etc/passwd", PASSWD.read_text().splitlines()[0]))
        files.append(("../../../../../../../../etc/passwd", PASSWD.read_text().splitlines()[0]))
    return files


@pytest.mark.parametrize("route", ["queue", "call"])
def test_a_server_path_as_an_image_input_is_refused(app, secret_file, route):
    before = _outputs_files(app)
    for path, secret in _server_files(secret_file):
        call = _queue_join if route == "queue" else call_api
        for last in (False, True):   # as the first frame, then as the last frame
            image = {"path": path, "meta": {"_type": "gradio.FileData"}, "orig_name": "photo.png"}
            # (the page's own protocol, /queue/join, sends every input: the video to extend, none, last)
            data = [None, image, *I2V_TAIL, *OVERRIDES, None] if last else [image, None, *I2V_TAIL, *OVERRIDES, None]
            reply = call(app, "image_to_video", data)
            assert secret not in reply, (path, reply)
            assert '"success":true' not in reply.replace(" ", ""), (path, reply)
            # The guard refuses it before gradio's own check (whose reason went to the console, not the caller).
            assert "was not uploaded to this app, which takes only files uploaded to it" in reply, (path, reply)
        absolute = Path(os.path.abspath(path))
        assert "Cannot move" not in app["log"].read_text()
        # A url instead of a path: file:// is not fetched either.
        image = {"path": "x.png", "url": "file://" + str(absolute), "meta": {"_type": "gradio.FileData"}}
        reply = call(app, "image_to_video", [image, None, *I2V_TAIL, *OVERRIDES, None])
        assert secret not in reply and '"success":true' not in reply.replace(" ", ""), (path, reply)
    assert _outputs_files(app) == before   # nothing ran


def _get(url: str) -> httpx.Response:
    """GET exactly this path: http.client sends '..' segments as written (httpx would remove them)."""
    parsed = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=10)
    try:
        connection.request("GET", url[len(f"{parsed.scheme}://{parsed.netloc}"):])
        reply = connection.getresponse()
        return httpx.Response(reply.status, content=reply.read())
    finally:
        connection.close()


def test_files_outside_the_outputs_folder_are_not_served(app, secret_file):
    url = app["url"]
    outputs = str(app["outputs"].resolve())
    for path, secret in _server_files(secret_file):
        absolute = str(Path(path).resolve()) if not path.startswith("..") else path
        candidates = [
            f"gradio_api/file={path}", f"gradio_api/file={absolute}", f"gradio_api/file={quote(absolute)}",
            f"gradio_api/file={quote(absolute, safe='')}", f"gradio_api/file/{absolute.lstrip('/')}",
            f"gradio_api/file={outputs}/../../../../../../../..{absolute}",
            f"gradio_api/file={outputs}/%2e%2e/%2e%2e/%2e%2e/%2e%2e/%2e%2e/%2e%2e/%2e%2e/%2e%2e{absolute}",
            f"gradio_api/file={quote(outputs + '/../../../../../../../..' + absolute, safe='')}",
            f"gradio_api/file={outputs}/..%2f..%2f..%2f..%2f..%2f..%2f..%2f..%2f{absolute.lstrip('/')}",
            f"gradio_api/file={outputs}%2f..%2f..%2f..%2f..%2f..%2f..%2f..%2f..{quote(absolute, safe='')}",
            f"file={absolute}", f"gradio_api/file=%252e%252e%252f{absolute}",
        ]
        for candidate in candidates:
            response = _get(url + candidate)
            assert secret not in response.text, (candidate, response.status_code)
            # 403 "File not allowed" from gradio's file route; 404 where no route matches.
            assert response.status_code in (403, 404), (candidate, response.status_code)


def test_the_models_folder_is_not_served(app, models_folder):
    response = _get(app["url"] + f"gradio_api/file={models_folder / 'my-wan' / 'model_index.json'}")
    assert response.status_code == 403 and "WanPipeline" not in response.text


def test_an_output_video_is_downloadable(app):
    reply = call_api(app, "text_to_video", [*_t2v("selftest-t2v", seed=21), *OVERRIDES])
    assert "event: complete" in reply, reply
    payload = json.loads(reply.split("event: complete", 1)[1].split("data:", 1)[1].strip())
    video = payload[0]["video"] if "video" in payload[0] else payload[0]
    served = _get(video["url"])
    assert served.status_code == 200
    written = [p for p in app["outputs"].rglob("*.mp4") if p.read_bytes() == served.content]
    assert len(written) == 1 and served.content[4:8] == b"ftyp"
    # The file is also reachable by its path in the outputs folder.
    direct = _get(app["url"] + f"gradio_api/file={written[0].resolve()}")
    assert direct.status_code == 200 and direct.content == served.content


def test_a_deleted_output_no_longer_downloads_from_where_the_page_got_it(app):
    reply = call_api(app, "text_to_video", [*_t2v("selftest-t2v", seed=23), *OVERRIDES])
    payload = json.loads(reply.split("event: complete", 1)[1].split("data:", 1)[1].strip())
    served = payload[0]["url"]
    assert _get(served).status_code == 200
    client = Client(app["url"], verbose=False)
    [entry] = [e for e in client.predict(api_name="/history") if e["seed"] == 23]
    client.predict(entry["key"], api_name="/delete_output")
    assert _get(served).status_code in (403, 404)
    assert not [p for p in Path(ROOT / ".served").rglob(Path(entry["media"]).name)]


def test_forgetting_served_copies_never_deletes_through_a_link(tmp_path):
    from ui.context import forget_served_copies

    served, elsewhere = tmp_path / "served", tmp_path / "elsewhere"
    (served / "abc123").mkdir(parents=True)
    elsewhere.mkdir()
    for folder in (served / "abc123", elsewhere):
        (folder / "120000_t2v_x_1.mp4").write_bytes(b"video")
    (served / "linked").symlink_to(elsewhere, target_is_directory=True)
    (served / "def456").mkdir()
    (served / "def456" / "120000_t2v_x_1.mp4").symlink_to(elsewhere / "120000_t2v_x_1.mp4")
    assert forget_served_copies(str(served), ["120000_t2v_x_1.mp4"]) == [served / "abc123" / "120000_t2v_x_1.mp4"]
    assert (elsewhere / "120000_t2v_x_1.mp4").read_bytes() == b"video"


def test_other_apps_files_in_the_shared_temp_folder_are_neither_served_nor_taken_as_input(app, image_file):
    import tempfile

    theirs = Path(tempfile.gettempdir()) / "gradio" / f"another-app-{uuid.uuid4().hex}"
    theirs.mkdir(parents=True)
    try:
        shutil.copy(image_file, theirs / "their-photo.png")
        (theirs / "notes.txt").write_text("THEIR-SECRET")
        for name in ("their-photo.png", "notes.txt"):
            response = _get(app["url"] + f"gradio_api/file={theirs / name}")
            assert response.status_code == 403 and b"THEIR-SECRET" not in response.content
        image = {"path": str(theirs / "their-photo.png"), "meta": {"_type": "gradio.FileData"}}
        reply = call_api(app, "image_to_video", [image, None, *I2V_TAIL, *OVERRIDES])
        assert "was not uploaded to this app" in reply and "event: complete" not in reply, reply
    finally:
        shutil.rmtree(theirs, ignore_errors=True)


def test_a_page_in_the_outputs_folder_is_served_as_text_not_run(app):
    page = app["outputs"] / "trap.html"
    page.write_text("<html><script>alert('hi')</script></html>")
    response = httpx.get(app["url"] + f"gradio_api/file={page.resolve()}", timeout=10)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    assert response.headers["content-disposition"].startswith("attachment")
    assert response.headers["x-content-type-options"] == "nosniff"
    page.unlink()


def test_the_app_keeps_its_served_copies_in_a_folder_of_its_own_and_removes_those_of_apps_that_ended(
        tmp_path, monkeypatch):
    import psutil

    from ui import startup

    monkeypatch.delenv("GRADIO_TEMP_DIR", raising=False)
    monkeypatch.delenv("GRADIO_ANALYTICS_ENABLED", raising=False)
    root = tmp_path / "served"
    running = psutil.Process(os.getppid())        # another process that runs: its folder stays
    theirs = root / startup._instance_name(running.pid, running.create_time())
    ended = root / "app-999999999-1000"           # no such process: an app that ended
    older = root / "b7672158b83e687f"             # the folder layout of earlier versions
    for folder in (theirs, ended, older):
        (folder / "kept").mkdir(parents=True)
    served = startup.prepare_served_dir(root=root)
    assert served.parent == root and list(served.iterdir()) == []
    assert (theirs / "kept").exists() and not ended.exists() and not older.exists()
    assert os.environ["GRADIO_TEMP_DIR"] == str(served) and os.environ["GRADIO_ANALYTICS_ENABLED"] == "False"
    (served / "left").mkdir()
    assert startup.prepare_served_dir(root=root) == served and list(served.iterdir()) == []


# ----- 3. upload size ------------------------------------------------------------
def test_uploads_over_50_mb_are_refused_and_small_ones_work(app, tmp_path, image_file):
    big = tmp_path / "big.png"
    with open(big, "wb") as f:
        f.truncate(51 * 1024 * 1024)
    upload = app["url"] + "gradio_api/upload"
    with httpx.Client(timeout=60) as http, open(big, "rb") as f:
        refused = http.post(upload, files={"files": ("big.png", f, "image/png")})
    assert refused.status_code == 413, (refused.status_code, refused.text)
    assert "maximum allowed size" in refused.text
    with httpx.Client(timeout=60) as http, open(image_file, "rb") as f:
        accepted = http.post(upload, files={"files": ("photo.png", f, "image/png")})
    assert accepted.status_code == 200
    [path] = accepted.json()
    assert Path(path).name == "photo.png"
    # And gradio_client, which uploads the same way, refuses it too.
    from gradio_client import handle_file

    client = Client(app["url"], verbose=False)
    with pytest.raises(Exception):
        client.predict(handle_file(str(big)), None, *I2V_TAIL, api_name="/image_to_video")


MARKUP = "**bold** [a link](http://evil.example/x) ![an image](//evil.example/x.png) <img src=x>"


def test_text_someone_typed_is_never_markup_and_never_reaches_another_visitor(app, client):
    """A model box full of markup is refused as no model; the owner's status shows the text as written (no
    link, no image, no bold), and another visitor's page shows none of it."""
    job = client.submit("selftest-t2v", "a fox", "", MARKUP, 64, 64, 9, 2, 5.0, 3.0, 7, api_name="/text_to_video")
    with pytest.raises(Exception, match=r"The model cannot be used: model '\*\*bold\*\* \[a link\]"):
        job.result(timeout=60)
    status = str(job.outputs()[-1][1])
    # Every mark escaped: no emphasis, no link or image syntax, no tag, no bare address.
    for escaped in ("\\*\\*bold\\*\\*", "\\[a link\\](http:\\/\\/evil.example/x)", "!\\[an image\\]", "&lt;img src=x&gt;"):
        assert escaped in status, (escaped, status)
    assert "<img" not in status
    other = Client(app["url"], verbose=False)
    assert "bold" not in other.predict(api_name="/system") and "evil" not in other.predict(api_name="/system")
    assert "evil" not in app["log"].read_text().split("[page]")[0]


def test_the_system_panel_names_a_loaded_folder_without_its_path(client, app, models_folder):
    client.predict("selftest-t2v", "a fox", "", str(models_folder / "my-wan"), 64, 64, 9, 2, 5.0, 3.0, 7,
                   api_name="/text_to_video")
    panel = Client(app["url"], verbose=False).predict(api_name="/system")
    assert "`my-wan` loaded" in panel and str(models_folder) not in panel
