"""The rules every request passes first (ui/guard.py): host names, wrong passwords, sessions of a login."""
from __future__ import annotations

from ui.guard import FREE_LOGIN_TRIES, HostAllowList, LoginThrottle, Owners, host_of


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


def test_wrong_passwords_wait_longer_and_longer_and_a_right_one_clears_them():
    clock = Clock()
    throttle = LoginThrottle(clock)
    for _ in range(FREE_LOGIN_TRIES):
        assert throttle.wait_for("10.0.0.2") == 0
        throttle.failed("10.0.0.2")
    assert throttle.wait_for("10.0.0.2") == 1.0 and throttle.wait_for("10.0.0.3") == 0
    clock.now += 1
    throttle.failed("10.0.0.2")
    assert throttle.wait_for("10.0.0.2") == 2.0
    clock.now += 2
    throttle.failed("10.0.0.2")
    assert throttle.wait_for("10.0.0.2") == 4.0
    throttle.succeeded("10.0.0.2")
    assert throttle.wait_for("10.0.0.2") == 0
    clock.now += 3600     # old failures drop out of the window
    assert throttle.wait_for("10.0.0.3") == 0


def test_a_session_belongs_to_the_login_that_used_it_first():
    owners = Owners(most=3)
    assert owners.claim("s1", "alice-token") and owners.claim("s1", "alice-token")
    assert not owners.claim("s1", "someone-else")
    for name in ("s2", "s3", "s4"):
        owners.claim(name, "x")
    assert owners.claim("s1", "someone-else")   # forgotten after `most` newer sessions: a new claim


def test_an_upload_belongs_to_every_login_that_uploaded_it():
    owners = Owners()
    owners.add(["/up/a.png"], "alice")
    assert not owners.others(["/up/a.png"], "alice") and owners.others(["/up/a.png"], "bob")
    owners.add(["/up/a.png"], "bob")      # the same content, uploaded again: the same path
    assert not owners.others(["/up/a.png", "/up/never-uploaded.png"], "bob")
