"""The guard and the routes of the server app.py makes, sent requests in this process (tests/helpers/app_object.py):
the password throttle on a clock the test moves, so what it lets through never depends on how fast a machine is."""
from __future__ import annotations

import asyncio

import pytest

from tests.helpers.aio import run_coroutine
from tests.helpers.app_object import Clock, app_object, client
from ui.guard import FREE_LOGIN_TRIES

USER, PASSWORD = "alice", "s3cret-pass"


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def locked(tmp_path, clock):
    """The server with a password, as colleagues on a network use it."""
    with app_object(tmp_path, "--auth", f"{USER}:{PASSWORD}", clock=clock) as asgi:
        yield asgi


def _login(http, password: str):
    return http.post("login", data={"username": USER, "password": password})


def test_wrong_passwords_sent_at_once_get_exactly_the_free_tries(locked, clock):
    """Forty at once are forty tries: exactly the free ones are answered, every other one waits (at least a second),
    the right password during the wait too; once the wait is over, it logs in."""
    async def scenario():
        async with client(locked) as http:
            answers = await asyncio.gather(*(_login(http, "guess") for _ in range(40)))
            during = await _login(http, PASSWORD)
            clock.advance(1.1)
            after = await _login(http, PASSWORD)
        return answers, during, after

    answers, during, after = run_coroutine(scenario())
    codes = [answer.status_code for answer in answers]
    assert codes.count(400) == FREE_LOGIN_TRIES and codes.count(429) == 40 - FREE_LOGIN_TRIES, codes
    for refused in (answer for answer in answers if answer.status_code == 429):
        assert int(refused.json()["detail"].split("wait ", 1)[1].split(" s", 1)[0]) >= 1
    assert during.status_code == 429 and "the right password too" in during.text
    assert after.status_code == 200


def test_wrong_passwords_from_one_address_are_slowed_down_and_the_right_one_clears_the_count(locked, clock):
    async def scenario():
        async with client(locked) as http:
            free = [await _login(http, "guess") for _ in range(FREE_LOGIN_TRIES)]
            slowed = await _login(http, PASSWORD)
            clock.advance(1.2)       # the first wait is a second; each wrong one after it doubles it
            right = await _login(http, PASSWORD)
            wrong_again = await _login(http, "guess")
            async with client(locked, ("127.0.0.2", 50124)) as other:   # another address is not slowed down
                elsewhere = await _login(other, PASSWORD)
        return free, slowed, right, wrong_again, elsewhere

    free, slowed, right, wrong_again, elsewhere = run_coroutine(scenario())
    assert [answer.status_code for answer in free] == [400] * FREE_LOGIN_TRIES
    assert slowed.status_code == 429 and "Too many wrong passwords from this address: wait" in slowed.text
    assert right.status_code == 200
    assert wrong_again.status_code == 400    # the right password cleared the count: a free try again
    assert elsewhere.status_code == 200


def test_without_a_login_the_api_the_uploads_and_the_files_are_closed(locked):
    async def scenario():
        async with client(locked) as http:
            return {
                "config": await http.get("config"),
                "join": await http.post("gradio_api/queue/join", json={
                    "data": ["selftest-t2v", "x", "", "selftest-t2v", 64, 64, 9, 1, 5.0, 3.0, 1],
                    "fn_index": 0, "session_hash": "stranger"}),
                "cancel": await http.post("gradio_api/run/cancel", json={"data": []}),
                "upload": await http.post("gradio_api/upload", files={"files": ("a.png", b"x")}),
                "json api": await http.get("api/v1/jobs"),
                "wrong": await _login(http, "wrong"),
                "right": await _login(http, PASSWORD),
                "config after": await http.get("config"),
            }

    answers = run_coroutine(scenario())
    for name in ("config", "join", "cancel", "upload", "json api"):
        assert answers[name].status_code == 401, (name, answers[name].status_code, answers[name].text[:200])
    assert answers["wrong"].status_code == 400 and "Incorrect credentials" in answers["wrong"].text
    assert answers["right"].status_code == 200 and answers["config after"].status_code == 200


@pytest.mark.parametrize("path", ["config", "gradio_api/info", "gradio_api/call/system", "", "api/v1/jobs", "metrics"])
def test_a_request_for_another_host_name_is_refused(tmp_path, path):
    """DNS rebinding: a page elsewhere that makes the browser ask this app under its own name gets nothing."""
    async def scenario():
        async with client(asgi) as http:
            forged = await http.get(path, headers={"Host": "evil.example"})
            named = {host: (await http.get("config", headers={"Host": host})).status_code
                     for host in ("127.0.0.1", "localhost", "localhost:7860")}
        return forged, named

    with app_object(tmp_path) as asgi:     # no password: this machine only
        forged, named = run_coroutine(scenario())
    assert forged.status_code == 400 and "not served under the name 'evil.example'" in forged.text
    assert named == {"127.0.0.1": 200, "localhost": 200, "localhost:7860": 200}


def test_a_server_with_a_password_refuses_another_host_name_too(locked):
    async def scenario():
        async with client(locked) as http:
            return await http.get("config", headers={"Host": "evil.example"})

    assert run_coroutine(scenario()).status_code == 400


def test_an_idle_server_looks_for_work_calmly_and_ctrl_c_cuts_the_pages_streams_quietly(tmp_path):
    """gradio's queue looks for work every millisecond unless told otherwise (4% of a core on an idle app); the
    streams Ctrl+C cuts after a second are said on the console without a traceback each."""
    import asyncio
    import logging

    from ui.serving import PROGRESS_IDLE_POLL_S, QUEUE_IDLE_POLL_S, _CutStreams

    with app_object(tmp_path) as asgi:
        queue = asgi.get_blocks()._queue
        assert (queue.sleep_when_free, queue.progress_update_sleep_when_free) == (QUEUE_IDLE_POLL_S,
                                                                                  PROGRESS_IDLE_POLL_S)

    def record(message: str, error: BaseException | None = None) -> logging.LogRecord:
        return logging.LogRecord("uvicorn.error", logging.ERROR, __file__, 1, message, None,
                                 (type(error), error, None) if error else None)

    cut = _CutStreams()
    assert not cut.filter(record("Exception in ASGI application", asyncio.CancelledError("timeout graceful shutdown")))
    assert not cut.filter(record("Cancel 1 running task(s), timeout graceful shutdown exceeded"))
    assert cut.filter(record("Exception in ASGI application", ValueError("a real fault")))
    assert cut.filter(record("Application startup complete."))


def test_the_status_tracker_module_is_served_with_its_clock_on_a_timer_and_every_other_asset_as_gradio_s(tmp_path):
    """ui/status_clock.py: gradio's status tracker module comes with the prelude first and is otherwise gradio's own
    file; its stylesheet, the other modules and a name outside gradio's assets are gradio's answers."""
    from pathlib import Path

    from gradio.route_utils import BUILD_PATH_LIB

    from ui.status_clock import PRELUDE

    assets = Path(BUILD_PATH_LIB)
    module = next(assets.glob("statustracker-*.js")).name
    style = next(assets.glob("statustracker-*.css")).name
    other = next(path.name for path in assets.glob("index-*.js"))

    async def scenario():
        async with client(asgi) as http:
            return {name: await http.get(f"assets/{name}") for name in (module, style, other, "statustracker-x.js",
                                                                        "statustracker-..%2Fx.js")}

    with app_object(tmp_path) as asgi:
        answers = run_coroutine(scenario())
    served = answers[module]
    assert served.status_code == 200 and served.headers["content-type"].startswith("text/javascript")
    assert served.text == PRELUDE + (assets / module).read_text(encoding="utf-8")
    assert "setTimeout(callback, 100)" in PRELUDE
    assert answers[style].status_code == 200 and answers[style].text == (assets / style).read_text(encoding="utf-8")
    assert answers[other].status_code == 200 and not answers[other].text.startswith(PRELUDE[:20])
    assert answers["statustracker-x.js"].status_code == 404
    assert answers["statustracker-..%2Fx.js"].status_code == 404
