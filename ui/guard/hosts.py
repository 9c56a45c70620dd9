"""The names this app answers to (Host), and whether a request comes from its own page (Origin, Referer)."""
from __future__ import annotations

import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
SHARE_DOMAIN = "*.gradio.live"
DEFAULT_PORTS = {"http": "80", "https": "443"}


def host_of(header: str) -> str:
    """The host name of a Host header, without its port: 'example.com:7860' -> 'example.com', '[::1]:80' -> '::1'."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


@dataclass(frozen=True)
class HostAllowList:
    names: frozenset[str]
    # The names the operator gave with --allowed-host (a proxy in front): a page under such a name is the app's own
    # page even when the proxy hands the app another Host.
    proxied: frozenset[str] = frozenset()

    @classmethod
    def for_server(cls, host: str, listen: bool, share: bool, extra=()) -> "HostAllowList":
        names = {*LOOPBACK_NAMES, host_of(host), *(host_of(h) for h in extra)}
        if listen or host_of(host) not in LOOPBACK_NAMES:
            names |= machine_names()
        if share:
            names.add(SHARE_DOMAIN)
        names.discard("0.0.0.0")
        return cls(frozenset(n for n in names if n), frozenset(host_of(h) for h in extra if host_of(h)))

    def allows(self, header: str | None) -> bool:
        if not header:
            return False
        host = host_of(header)
        return host in self.names or any(n.startswith("*.") and host.endswith(n[1:]) for n in self.names)

    def same_origin(self, origin: str, host_header: str) -> bool:
        """Whether ``origin`` (an Origin header, or a Referer's scheme://host:port) is the page this request was
        sent to: the same host and port as the Host header, as written (default ports left out), or a name the
        operator allowed for a proxy. 'null' (a sandboxed frame, a file on disk) is never the app's page."""
        try:
            parts = urlsplit(origin.strip())
            port = parts.port
        except ValueError:
            return False
        if parts.scheme not in DEFAULT_PORTS or not parts.hostname:
            return False
        if parts.hostname.lower() in self.proxied:
            return True
        written = parts.hostname.lower() if parts.hostname.count(":") == 0 else f"[{parts.hostname.lower()}]"
        if port is not None and str(port) != DEFAULT_PORTS[parts.scheme]:
            written += f":{port}"
        return written == _without_default_port(host_header.strip().lower())


def _without_default_port(host: str) -> str:
    for port in DEFAULT_PORTS.values():
        if host.endswith(f":{port}"):
            return host[:-len(port) - 1]
    return host


def machine_names() -> set[str]:
    """This machine's own names and addresses (what a colleague on the network types to reach it)."""
    import psutil

    names = {socket.gethostname().lower(), socket.getfqdn().lower()}
    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family in (socket.AF_INET, socket.AF_INET6):
                names.add(address.address.split("%")[0].lower())
    return names
