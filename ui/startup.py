"""What starting the page checks and prepares before gradio loads: the port, the password, and the folder gradio
keeps its copies of files in. Nothing here imports gradio (the served folder must be set before it loads)."""
from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path

# Where gradio keeps its copies of results and uploads: in the app's own folder, one per running app.
SERVED_ROOT = Path(__file__).resolve().parent.parent / ".served"


def resolve_auth(args) -> tuple[str, str] | None:
    """The (user, password) the page needs; generated once when reachable from other machines without --auth.

    Reachable: --listen, --share, or a --host that is not a loopback address (0.0.0.0, a LAN address).
    """
    if args.auth:
        user, sep, password = args.auth.partition(":")
        if not sep or not user or not password:
            raise SystemExit("error: --auth must look like user:password")
        return user, password
    import ipaddress

    try:
        loopback = ipaddress.ip_address(args.host).is_loopback
    except ValueError:
        loopback = args.host == "localhost"
    # --host 0.0.0.0 or a LAN address is as reachable as --listen.
    if args.listen or args.share or not loopback:
        password = secrets.token_urlsafe(12)
        print(f"The page is reachable from other machines, so it needs a password.\n"
              f"  user: wan   password: {password}\n(pass --auth user:password to choose your own)", flush=True)
        return "wan", password
    return None


def api_tokens(path: str | None) -> tuple[str, ...]:
    """The JSON API's tokens (serve --api-token FILE), or none; SystemExit with the reason for a file that cannot
    be used."""
    if not path:
        return ()
    from ui.guard.api_login import TokenFileError, read_tokens

    try:
        return read_tokens(path)
    except TokenFileError as exc:
        raise SystemExit(f"error: {exc}") from None


def prepare_served_dir(root: Path = SERVED_ROOT) -> Path:
    """The folder gradio keeps its copies of results and uploads in: the app's own (not the shared system temp
    folder, whose files other apps put there) and this running app's alone, named after its process, so a second
    app on the same outputs folder never empties the first one's. Folders of apps that no longer run are removed.
    Gradio's telemetry goes off. Must run before gradio is imported."""
    import psutil

    me = psutil.Process()
    served = root / _instance_name(me.pid, me.create_time())
    root.mkdir(parents=True, exist_ok=True)
    for folder in root.iterdir():
        if folder.is_symlink():
            folder.unlink()
        elif folder.name != served.name and not _instance_runs(folder.name):
            shutil.rmtree(folder, ignore_errors=True)
    shutil.rmtree(served, ignore_errors=True)
    served.mkdir(parents=True)
    os.environ["GRADIO_TEMP_DIR"] = str(served)
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    return served


def _instance_name(pid: int, started: float) -> str:
    return f"app-{pid}-{int(started * 1000)}"


def _instance_runs(name: str) -> bool:
    """Whether the app a served folder is named after still runs (the same process id, started at that time)."""
    import psutil

    try:
        _, pid, _ = name.split("-")
        process = psutil.Process(int(pid))
        return _instance_name(process.pid, process.create_time()) == name
    except (ValueError, psutil.Error):
        return False


def port_in_use(host: str, port: int) -> bool:
    """Whether another program listens on ``port`` at ``host`` (checked by binding it, as the server will)."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror:
        return False       # the server will say what is wrong with the name
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        if os.name != "nt":     # as the server binds: a port left in TIME_WAIT by a stopped app is free
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError:
            return True
    return False


def port_taken_message(host: str, port: int) -> str:
    free = next((p for p in range(port + 1, port + 50) if not port_in_use(host, p)), port + 1)
    return f"Port {port} is in use (another Wan Studio?): start with --port {free}"


# The most one job may take on a server others use (a password or API tokens), unless serve --max-job-minutes says.
SHARED_JOB_MINUTES = 60.0


def job_ceiling(minutes: float | None, shared: bool):
    """The ceiling on one job's time: ``minutes`` as given (0: none), else SHARED_JOB_MINUTES on a ``shared``
    server and none on one's own machine."""
    from engine.planning.job_time import JobCeiling

    return JobCeiling.minutes(SHARED_JOB_MINUTES if minutes is None and shared else minutes)
