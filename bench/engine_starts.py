"""How an engine process starts, measured: forked from the fork server that loaded the libraries
(engine/service/starts.py) against spawned, on this machine's device.

    python bench/engine_starts.py OUT.json            # on a GPU machine (or the CPU: it says which it ran on)

For each way (``WAN_ENGINE_START`` unset: forked; ``spawn``), in a fresh process of its own so that no fork
server runs yet: a WorkerClient's first engine, from the request to its "ready" (a fork server's first engine waits
for the server's load of torch, diffusers and transformers), its device as the engine sees it, a 2-step still on
the self-test model, then the engine killed (SIGKILL) and the time to the next engine's "ready", and the same
still again on that one. For the forked way it also reads, from outside, whether the fork server has touched the
device: its open files (``/dev/nvidia*``, ``/dev/kfd``, ``/dev/dri``) and the device driver's library in its memory
map, which must be absent for a forked engine to start its device as a spawned one does.

Nothing here asserts a time: the numbers are the output.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DEVICE_FILES = ("/dev/nvidia", "/dev/kfd", "/dev/dri")
DRIVER_LIBRARIES = ("libcuda.so", "libamdhip64.so", "libhsa-runtime64.so")


def _server_touches(server_pid: int) -> dict:
    """What of a device the fork server holds: device files open, the driver's library mapped."""
    opened = []
    for fd in Path(f"/proc/{server_pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith(DEVICE_FILES):
            opened.append(target)
    maps = Path(f"/proc/{server_pid}/maps").read_text()
    return {"device_files_open": sorted(set(opened)),
            "driver_libraries_mapped": sorted({name for name in DRIVER_LIBRARIES if name in maps})}


def _still(client, work: Path, seed: int) -> dict:
    from engine.events import JobFinished, PhaseFinished
    from engine.settings.presets import load_presets
    from engine.settings.request import GenerationRequest

    request = GenerationRequest.from_preset(load_presets()["selftest-t2v"], "a red fox", mode="t2i",
                                            model="selftest-t2v", outputs_dir=str(work / "outputs"), seed=seed,
                                            frames=1, steps=2)
    start = time.monotonic()
    events = list(client.submit(request))
    return {"ended": type(events[-1]).__name__, "ok": isinstance(events[-1], JobFinished),
            "message": getattr(events[-1], "message", ""), "seconds": round(time.monotonic() - start, 3),
            "phases": {e.phase: round(e.seconds, 3) for e in events if isinstance(e, PhaseFinished)}}


def one_way(work: Path) -> dict:
    """In this process: the first engine, a still, a kill, the next engine, a still."""
    import psutil

    from engine.service.starts import engine_context
    from engine.service.worker import WorkerClient

    way = engine_context().get_start_method()
    client = WorkerClient(work / "models", outputs_dir=work / "outputs")
    try:
        start = time.monotonic()
        client.start()
        hardware = client.hardware(timeout=600)
        first_ready = time.monotonic() - start
        parent = psutil.Process(client.pid).parent()
        server = parent.pid if parent.pid != os.getpid() else None
        result = {"way": way, "backend": hardware.backend, "device": hardware.device_name,
                  "first_ready_s": round(first_ready, 3), "first_still": _still(client, work, 1)}
        if server is not None:
            result["fork_server_after_first_start"] = _server_touches(server)
        killed = client.pid
        os.kill(killed, signal.SIGKILL)
        while psutil.pid_exists(killed) and psutil.Process(killed).status() != psutil.STATUS_ZOMBIE:
            time.sleep(0.01)
        time.sleep(0.2)   # the client sees it gone
        start = time.monotonic()
        client.start()
        client.hardware(timeout=600)
        result["restart_ready_s"] = round(time.monotonic() - start, 3)
        result["restarted_from_server"] = server is not None and psutil.Process(client.pid).parent().pid == server
        result["second_still"] = _still(client, work, 2)
        if server is not None:
            result["fork_server_after_device_use"] = _server_touches(server)
        return result
    finally:
        client.close()


def main() -> None:
    out = Path(sys.argv[1])
    if len(sys.argv) > 2 and sys.argv[2] == "--one":   # a child run: one way, printed as JSON
        print("RESULT " + json.dumps(one_way(Path(sys.argv[3]))), flush=True)
        return
    results = {"python": sys.version.split()[0], "ways": []}
    with tempfile.TemporaryDirectory() as folder:
        for way in ("fork", "spawn"):
            env = {**os.environ, "HF_HUB_OFFLINE": "1"}
            if way == "spawn":
                env["WAN_ENGINE_START"] = "spawn"
            done = subprocess.run([sys.executable, __file__, str(out), "--one", folder], capture_output=True,
                                  text=True, env=env, timeout=900)
            lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
            results["ways"].append(json.loads(lines[-1][7:]) if lines else
                                   {"way": way, "failed": done.stderr[-3000:], "rc": done.returncode})
            print(json.dumps(results["ways"][-1], indent=1), flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    print(f"[bench] results in {out}")


if __name__ == "__main__":
    main()
