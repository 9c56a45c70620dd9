"""The rules every request passes first (ui/guard/): host names, origins, the one reading of a request, the routes,
wrong passwords, and what each login holds."""
from __future__ import annotations

import os
import threading

import pytest

from tests.helpers.aio import run_coroutine
from ui.guard import FREE_LOGIN_TRIES, Holdings, HostAllowList, LoginThrottle, host_of
from ui.guard.reading import Refused, file_key, parse_json, plain_path, read_request
from ui.guard.routes import RouteTable


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_a_host_header_is_read_without_its_port():
    assert host_of("Example.COM:7860") == "example.com"
    assert host_of("[::1]:7860") == "::1" and host_of("::1") == "::1"
    assert host_of("localhost") == "localhost"


def test_this_machine_only_allows_its_loopback_names():
    hosts = HostAllowList.for_server("127.0.0.1", listen=False, share=False)
    assert all(hosts.allows(h) for h in ("127.0.0.1:7860", "localhost:7860", "[::1]:7860"))
    assert not any(hosts.allows(h) for h in ("evil.example", "evil.example:7860", "127.0.0.1.evil.example", "", None))


def test_listening_or_sharing_adds_the_machine_s_names_the_share_domain_and_what_the_operator_names():
    import socket

    listening = HostAllowList.for_server("127.0.0.1", listen=True, share=False, extra=["studio.example.org"])
    assert listening.allows(socket.gethostname() + ":7860") and listening.allows("studio.example.org")
    assert not listening.allows("evil.example")
    sharing = HostAllowList.for_server("127.0.0.1", listen=False, share=True)
    assert sharing.allows("abc123.gradio.live") and not sharing.allows("gradio.live.evil.example")


def test_only_the_app_s_own_page_is_its_origin():
    hosts = HostAllowList.for_server("127.0.0.1", listen=False, share=True, extra=["studio.example.org"])
    assert hosts.same_origin("http://127.0.0.1:7902", "127.0.0.1:7902")
    assert hosts.same_origin("http://LOCALHOST:7902", "localhost:7902")
    assert hosts.same_origin("https://abc.gradio.live", "abc.gradio.live")     # the share link: default ports
    assert hosts.same_origin("http://localhost", "localhost:80")
    # Another port of the same machine is another site; so is another share link, or a sandboxed page.
    for origin, host in (("http://localhost:7997", "127.0.0.1:7902"), ("http://127.0.0.1:7997", "127.0.0.1:7902"),
                         ("https://evil.gradio.live", "abc.gradio.live"), ("null", "127.0.0.1:7902"),
                         ("file://", "127.0.0.1:7902"), ("http://127.0.0.1:99999", "127.0.0.1:7902"), ("", "x")):
        assert not hosts.same_origin(origin, host), origin
    # A proxy the operator named may hand the app another Host.
    assert hosts.same_origin("https://studio.example.org", "127.0.0.1:7860")


def test_wrong_passwords_wait_longer_and_longer_and_a_right_one_clears_them():
    clock = Clock()
    throttle = LoginThrottle(clock)
    for _ in range(FREE_LOGIN_TRIES):
        assert throttle.start("10.0.0.2") == 0
    assert throttle.start("10.0.0.2") == 1 and throttle.start("10.0.0.3") == 0
    clock.now += 1
    assert throttle.start("10.0.0.2") == 0       # the sixth try, after its second
    assert throttle.start("10.0.0.2") == 2
    clock.now += 0.2
    assert throttle.start("10.0.0.2") == 2       # 1.8 s left is said as 2 s, never as 0
    clock.now += 1.79
    assert throttle.start("10.0.0.2") == 1       # 0.01 s left: still a whole second, never "wait 0 s"
    throttle.succeeded("10.0.0.2")
    assert throttle.start("10.0.0.2") == 0
    clock.now += 3600     # old tries drop out of the window
    assert throttle.start("10.0.0.3") == 0


def test_tries_sent_at_once_are_counted_as_they_start():
    throttle = LoginThrottle()
    answers, barrier = [], threading.Barrier(40)

    def one_try():
        barrier.wait()
        answers.append(throttle.start("10.0.0.9"))
    threads = [threading.Thread(target=one_try) for _ in range(40)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert answers.count(0) == FREE_LOGIN_TRIES and all(a >= 1 for a in answers if a)


def test_a_name_belongs_to_the_login_that_used_it_first_while_that_login_lives():
    holdings = Holdings(sessions_per_login=3)
    assert holdings.claim("s1", "alice") and holdings.claim("s1", "alice")
    assert not holdings.claim("s1", "mallory")
    # Mallory's own names, however many, never push out Alice's.
    for n in range(50):
        holdings.claim(f"m{n}", "mallory")
    assert not holdings.claim("s1", "mallory") and holdings.owner("s1") == "alice"
    # Alice's own newer names do, beyond her bound.
    for name in ("s2", "s3", "s4"):
        holdings.claim(name, "alice")
    assert holdings.owner("s1") is None and holdings.owner("s4") == "alice"
    # A login that ended leaves its names free.
    assert holdings.claim("s4", "mallory", live=lambda login: login != "alice")


def test_an_upload_belongs_to_every_login_that_uploaded_it(tmp_path):
    photo = tmp_path / "a.png"
    photo.write_bytes(b"x" * 10)
    holdings = Holdings(folder=tmp_path)
    key = file_key(str(photo))
    holdings.uploaded([key], "alice")
    assert not holdings.others([key], "alice") and holdings.others([key], "bob")
    holdings.uploaded([key], "bob")      # the same content, uploaded again: the same path
    assert not holdings.others([key, file_key(str(tmp_path / "never-uploaded.png"))], "bob")
    # An ended login's uploads are nobody's.
    holdings.sweep(live=lambda login: False)
    assert holdings.others([key], "alice") and holdings.others([key], "bob")


def test_unused_uploads_are_bounded_per_login_and_removed_after_their_hour(tmp_path):
    clock = Clock()
    holdings = Holdings(folder=tmp_path, unused_bytes=100, unused_s=3600, clock=clock)
    unused, used = tmp_path / "h1" / "a.png", tmp_path / "h2" / "b.png"
    for path in (unused, used):
        path.parent.mkdir()
        path.write_bytes(b"x" * 60)
    holdings.uploaded([file_key(str(unused)), file_key(str(used))], "alice")
    holdings.used([file_key(str(used))])
    assert holdings.room_for("alice", 40) is None and holdings.room_for("alice", 41) == 60
    assert holdings.room_for("bob", 100) is None
    clock.now += 3599
    assert holdings.sweep() == [] and unused.exists()
    clock.now += 2
    assert holdings.sweep() == [file_key(str(unused))]
    assert not unused.exists() and not unused.parent.exists() and used.exists()
    assert holdings.removed([file_key(str(unused))], "alice") == file_key(str(unused))
    assert holdings.removed([file_key(str(unused))], "bob") is None
    assert holdings.room_for("alice", 100) is None


def test_nothing_outside_the_uploads_folder_is_ever_removed(tmp_path):
    folder, elsewhere = tmp_path / "served", tmp_path / "elsewhere"
    folder.mkdir(), elsewhere.mkdir()
    victim = elsewhere / "victim.png"
    victim.write_bytes(b"keep me")
    (folder / "link").symlink_to(elsewhere)
    clock = Clock()
    holdings = Holdings(folder=folder, unused_s=1, clock=clock)
    holdings.uploaded([file_key(str(victim)), file_key(str(folder / "link" / "victim.png"))], "alice")
    clock.now += 10
    assert holdings.sweep() == [] and victim.read_bytes() == b"keep me"


@pytest.mark.parametrize("path, plain", [
    ("/gradio_api/queue/data", True), ("/", True), ("/assets/index-1.js", True),
    ("//gradio_api/queue/data", False), ("/gradio_api//queue/data", False), ("/gradio_api/./queue/data", False),
    ("/assets/../routes.py", False), ("/assets/x/..", False), ("/gradio_api\\queue", False), ("/a\x00b", False),
])
def test_only_plainly_written_paths_are_read(path, plain):
    assert plain_path(path) is plain


def test_two_spellings_of_one_file_are_one_key(tmp_path):
    (tmp_path / "d").mkdir()
    target = tmp_path / "d" / "secret.png"
    target.write_bytes(b"x")
    (tmp_path / "link").symlink_to(tmp_path / "d")
    spellings = [str(target), f"{tmp_path}//d/secret.png", f"{tmp_path}/./d/secret.png",
                 f"{tmp_path}/d/../d/secret.png", f"{tmp_path}/link/secret.png"]
    assert {file_key(s) for s in spellings} == {file_key(str(target))}


def test_a_json_key_given_twice_or_too_deep_is_refused():
    assert parse_json(b'{"session_hash": "a", "data": [1]}') == {"session_hash": "a", "data": [1]}
    with pytest.raises(Refused, match="'session_hash' twice"):
        parse_json(b'{"session_hash": "mine", "session_hash": "theirs"}')
    with pytest.raises(Refused, match="not JSON"):
        parse_json(b"[" * 200_000 + b"]" * 200_000)


def _read(method: str, path: str, query: bytes = b"", headers=(), body: bytes = b""):
    found = RouteTable.of().match(method, path)
    assert found, path

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}
    scope = {"type": "http", "method": method, "path": path, "query_string": query, "headers": list(headers)}
    return run_coroutine(read_request(scope, receive, *found))[0]


def test_a_request_is_read_as_gradio_reads_it():
    join = _read("POST", "/gradio_api/queue/join", headers=[(b"content-type", b"Application/JSON; charset=utf-8")],
                 body=b'{"session_hash": "s1", "data": [{"path": "/x//y/./z.png"}]}')
    assert join.session() == "s1" and join.files == (file_key("/x/y/z.png"),)
    # No content type: FastAPI parses JSON all the same, and so does the guard.
    assert _read("POST", "/gradio_api/call/text_to_video", body=b'{"session_hash": "s2"}').session() == "s2"
    assert _read("GET", "/gradio_api/heartbeat/s3").session() == "s3"
    assert _read("GET", "/gradio_api/queue/data", query=b"session_hash=s4").session() == "s4"
    assert _read("GET", "/gradio_api/call/text_to_video/e1").event() == "e1"
    assert _read("GET", "/gradio_api/file=/a//b/../c.png").files == (file_key("/a/c.png"),)
    assert _read("GET", "/gradio_api/file=https://example.com/x.png").urls == ("https://example.com/x.png",)
    with pytest.raises(Refused, match="'session_hash' twice"):
        _read("GET", "/gradio_api/queue/data", query=b"session_hash=mine&session_hash=theirs")
    with pytest.raises(Refused) as refused:
        _read("POST", "/gradio_api/queue/join", headers=[(b"content-type", b"text/plain")], body=b"{}")
    assert refused.value.status == 415
    with pytest.raises(Refused, match="'cookie' twice"):
        _read("GET", "/config", headers=[(b"cookie", b"a=1"), (b"cookie", b"a=2")])


def test_gradio_s_other_routes_are_not_answered():
    routes = RouteTable.of()
    for method, path in (("GET", "/gradio_api/file/etc/passwd"), ("GET", "/gradio_api/proxy=http://x/"),
                         ("POST", "/gradio_api/stream/abc"), ("GET", "/gradio_api/stream/s/r/1/playlist.m3u8"),
                         ("GET", "/monitoring"), ("POST", "/gradio_api/vibe-edit"), ("POST", "/gradio_api/reset/"),
                         ("POST", "/gradio_api/component_server"), ("GET", "/gradio_api/queue/join"),
                         ("GET", "/file=/etc/passwd"), ("OPTIONS", "/gradio_api/queue/join"),
                         ("POST", "/gradio_api/process_recording"), ("GET", "/gradio_api/run-history/buckets")):
        assert routes.match(method, path) is None, (method, path)
    for method, path in (("GET", "/"), ("POST", "/gradio_api/queue/join"), ("GET", "/gradio_api/file=/x.mp4"),
                         ("POST", "/gradio_api/call/text_to_video"), ("POST", "/gradio_api/run/predict")):
        assert routes.match(method, path) is not None, (method, path)


def test_the_guard_reads_files_with_the_operating_system_s_own_rules():
    assert file_key("relative/x.png") == os.path.normcase(os.path.realpath(os.path.abspath("relative/x.png")))
