"""The Prometheus metrics of a real run, for the README's dashboard picture: jobs of the real-size 1.3B model through
the WorkerClient and the job queue as the page drives them, counted by the app's ServiceMetrics, with /metrics
read every second (every quarter second with --tiny) meanwhile (what Prometheus would have scraped), timestamps
kept.

    python bench/monitoring_feed.py OUT.json [--work DIR]     # on a GPU: real-size random 1.3B weights
    python bench/monitoring_feed.py OUT.json --tiny           # the same code on the CPU (self-test model)
    python bench/monitoring_feed.py --picture OUT.json PICTURE.png   # Prometheus' graphs of the run

``--picture`` writes the samples as OpenMetrics with their timestamps, puts them into a fresh Prometheus data folder
(``promtool tsdb create-blocks-from openmetrics``), starts Prometheus on it and opens its graph page of the
dashboard's queries (docs/monitoring/grafana-dashboard.json) over the run in the headless browser the tests use.

The jobs: quick and long text-to-video jobs and stills, one refused (a width the model cannot take), one failed
(a LoRA whose finite values overflow the denoise), one cancelled mid-denoise. Nothing here asserts.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")

SCRAPE_S = 1.0
TINY_SCRAPE_S = 0.25   # --tiny: the self-test model's jobs take a fraction of a second each, and its run checks the code
# (tag, mode, size and steps) of the run, in order; "refused", "failed" and "cancelled" end so on purpose.
JOBS = (("warm", "t2v", dict(width=480, height=480, frames=25, steps=4)),
        ("fastwan", "t2v", dict(width=832, height=480, frames=81, steps=4)),
        ("still", "t2i", dict(width=832, height=480, frames=1, steps=8)),
        ("refused", "t2v", dict(width=70, height=480, frames=81, steps=4)),
        ("long", "t2v", dict(width=832, height=480, frames=81, steps=30)),
        ("failed", "t2v", dict(width=480, height=480, frames=25, steps=4)),
        ("fastwan", "t2v", dict(width=832, height=480, frames=81, steps=4)),
        ("cancelled", "t2v", dict(width=832, height=480, frames=81, steps=30)),
        ("still", "t2i", dict(width=832, height=480, frames=1, steps=8)),
        ("fastwan", "t2v", dict(width=832, height=480, frames=81, steps=8)))
# The labels Prometheus adds to what it scrapes (the dashboard selects by instance).
SCRAPED = {"job": "wan-studio", "instance": "127.0.0.1:7860"}
TINY = dict(width=64, height=64, frames=9)
WHAT = {"t2v": "text to video", "t2i": "text to image"}


class Scraper:
    """Reads ``metrics`` every ``interval`` seconds in a thread of its own: (unix time, sample name, labels, value)."""

    def __init__(self, metrics, interval: float = SCRAPE_S):
        self.metrics, self.interval, self.samples, self.stop = metrics, interval, [], threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        from prometheus_client.parser import text_string_to_metric_families

        while not self.stop.wait(self.interval):
            now = time.time()
            body, _ = self.metrics.exposition()
            for family in text_string_to_metric_families(body.decode()):
                self.samples.extend((now, s.name, dict(s.labels), s.value) for s in family.samples)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        time.sleep(3 * self.interval)   # the idle engine after the last job, as Prometheus would see it
        self.stop.set()
        self.thread.join()


def overcooked_lora(path: Path, folder: Path) -> Path:
    """A LoRA on every attention linear of the model in ``folder``, each value finite and far too large."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    tensors = {}
    with safe_open(str(folder / "transformer" / "diffusion_pytorch_model.safetensors"), "pt") as f:
        for key in f.keys():
            if key.startswith("blocks.") and ".attn1.to_q.weight" in key:
                rows, columns = f.get_slice(key).get_shape()
                name = key[:-len(".weight")]
                tensors[f"transformer.{name}.lora_A.weight"] = torch.full((4, columns), 1e20)
                tensors[f"transformer.{name}.lora_B.weight"] = torch.full((rows, 4), 1e20)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path))
    return path


def run_one(client, jobs, metrics, request, what: str, cancel_after_s: float | None = None) -> dict:
    """One job as ui/generate.py runs it: checked (a refusal is counted), queued, run, counted as it ended."""
    from engine.errors import InputError
    from engine.events import JobCancelled, JobFailed, JobFinished
    from engine.service.metrics import JobRecord, outcome_of

    mode = {"text to video": "t2v", "text to image": "t2i"}[what]
    try:
        checked, _ = client.check(request)
    except InputError as refused:
        metrics.job_ended(JobRecord(mode, "", "refused", failure="input"))
        return {"outcome": "refused", "said": str(refused)[:200]}
    ticket = jobs.join("bench", what, 1, request.settings.model)
    assert jobs.wait_turn(ticket, 600)
    started, last = time.monotonic(), None
    timer = threading.Timer(cancel_after_s or 0.0, client.cancel)
    if cancel_after_s is not None:
        timer.start()
    for event in client.run(checked):
        last = event
    timer.cancel()   # never the next job's
    ending = last.ending if isinstance(last, (JobFinished, JobCancelled, JobFailed)) else None
    jobs.leave(ticket, ending)
    seconds = time.monotonic() - started
    failure = str(last.kind) if isinstance(last, JobFailed) else None
    metrics.job_ended(JobRecord(mode, request.settings.model, outcome_of(ending), seconds,
                                dict(last.timings) if isinstance(last, JobFinished) else None, failure,
                                waited=ticket.started - ticket.joined))
    return {"outcome": outcome_of(ending), "seconds": round(seconds, 2),
            "timings": getattr(last, "timings", None), "peak_vram_gb": getattr(last, "peak_vram_gb", None)}


def feed(out: Path, work: Path, tiny: bool) -> None:
    from engine.service.jobqueue import JobQueue
    from engine.service.metrics import ServiceMetrics
    from engine.service.worker import WorkerClient
    from engine.settings.presets import load_presets
    from engine.settings.request import GenerationRequest
    from engine.settings.loras import parse_lora

    from bench.speed_setup import Setup, build_folder, leave_libraries_out_of_collections

    setup = Setup.make(tiny, work, out)
    folder = build_folder(setup)
    if tiny:   # past the libraries' objects at the exit
        leave_libraries_out_of_collections(engine=False)
    lora = overcooked_lora(work / "models" / "loras" / "overcooked.safetensors", folder)
    preset = load_presets()["fastwan21-t2v-1.3b"]
    jobs, client = JobQueue(), WorkerClient(work / "models", outputs_dir=work / "outputs", preview_seconds=-1)
    metrics = ServiceMetrics(jobs, client)
    results = {"started": time.time(), "jobs": []}
    with Scraper(metrics, TINY_SCRAPE_S if tiny else SCRAPE_S) as scraper:
        for tag, mode, size in JOBS:
            size = {**size, **(TINY if tiny and tag != "refused" else {}),
                    **({"frames": 1} if mode == "t2i" else {})}
            extra = {"loras": (parse_lora(f"{lora}:1"),)} if tag == "failed" else {}
            request = GenerationRequest.from_preset(preset, f"a paper boat on a pond, {tag}", model=str(folder),
                                                    seed=len(results["jobs"]), outputs_dir=str(work / "outputs"),
                                                    **size, **extra)
            cancel = (0.5 if tiny else 8.0) if tag == "cancelled" else None
            row = run_one(client, jobs, metrics, request, WHAT[mode], cancel)
            results["jobs"].append({"tag": tag, "mode": mode, **size, **row})
            print(f"[feed] {tag}: {row}", flush=True)
            time.sleep(TINY_SCRAPE_S if tiny else 2 * SCRAPE_S)   # a gap between jobs, as people leave one
    client.close()
    results.update(ended=time.time(), samples=scraper.samples)
    import torch

    results["machine"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    out.write_text(json.dumps(results))


def openmetrics(feed_path: Path, om_path: Path) -> int:
    """The feed's samples as OpenMetrics, each sample name its own family (of type unknown: PromQL reads the series
    alike), each series in time order; how many samples. Timestamps in seconds, as OpenMetrics has them."""
    samples = json.loads(feed_path.read_text())["samples"]
    series: dict[str, dict[tuple, list]] = {}
    for now, name, labels, value in samples:
        key = tuple(sorted({**labels, **SCRAPED}.items()))
        series.setdefault(name, {}).setdefault(key, []).append((now, value))
    lines = []
    for name in sorted(series):
        lines.append(f"# TYPE {name} unknown")
        for key, points in series[name].items():
            text = ",".join(f'{label}="{_escaped(value)}"' for label, value in key)
            labels = f"{{{text}}}" if text else ""
            lines.extend(f"{name}{labels} {_number(value)} {now:.3f}" for now, value in sorted(points))
    om_path.write_text("\n".join(lines) + "\n# EOF\n")
    return len(samples)


def _escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    return "+Inf" if value == float("inf") else repr(float(value))


GRAPHED = ("Jobs by outcome", "Job time", "Seconds per phase", "GPU utilization", "VRAM", "Engine RAM")


@contextmanager
def backfilled_prometheus(feed_path: Path) -> Iterator[str]:
    """A Prometheus server on a data folder holding the feed's samples (promtool's backfill of its OpenMetrics);
    its address."""
    import shutil
    import subprocess
    import tempfile

    import httpx

    from tests.conftest import free_port
    from tests.prometheus_setup import find_installed

    prometheus = os.environ.get("WAN_TEST_PROMETHEUS") or find_installed()
    folder = Path(tempfile.mkdtemp(prefix="monitoring-picture-"))
    try:
        openmetrics(feed_path, folder / "feed.om")
        subprocess.run([str(Path(prometheus).with_name("promtool")), "tsdb", "create-blocks-from", "openmetrics",
                        str(folder / "feed.om"), str(folder / "data")], check=True, capture_output=True)
        (folder / "prometheus.yml").write_text("global: {}\n")
        port = free_port()
        server = subprocess.Popen([prometheus, f"--config.file={folder / 'prometheus.yml'}",
                                   f"--storage.tsdb.path={folder / 'data'}", "--storage.tsdb.retention.time=10y",
                                   f"--web.listen-address=127.0.0.1:{port}"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        try:
            for _ in range(120):
                try:
                    if httpx.get(f"{url}/-/ready", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.5)
            yield url
        finally:
            server.terminate()
            server.wait(timeout=30)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def picture(feed_path: Path, png: Path) -> dict:
    """Prometheus' graph page of the dashboard's queries over the feed's run, as ``png``; what each query answered
    at the run's end (title -> its series)."""
    import urllib.parse

    import httpx
    from playwright.sync_api import sync_playwright

    from tests.browser.test_monitoring import dashboard_queries
    from tests.browser_setup import find_installed as find_browser
    from tests.conftest import CHROMIUM_FLAGS

    run = json.loads(feed_path.read_text())
    queries = [(title, expr.replace("[1m]", "[30s]")) for title, expr in dashboard_queries()]
    with backfilled_prometheus(feed_path) as url:
        answers = {title: httpx.get(f"{url}/api/v1/query", params={"query": expr, "time": run["ended"]}).json()
                   ["data"]["result"] for title, expr in queries}
        minutes = max(1, int((run["ended"] - run["started"]) // 60) + 1)
        end = time.strftime("%Y-%m-%d %H:%M", time.gmtime(run["ended"] + 60))
        params = {}
        firsts = {title: expr for title, expr in reversed(queries)}   # a panel's first query (the median, used)
        for number, expr in enumerate(firsts[title] for title in GRAPHED):
            params.update({f"g{number}.expr": expr, f"g{number}.tab": "0", f"g{number}.range_input": f"{minutes}m",
                           f"g{number}.end_input": end})
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=os.environ.get("WAN_TEST_BROWSER") or
                                                 find_browser(), headless=True, args=CHROMIUM_FLAGS)
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(f"{url}/graph?{urllib.parse.urlencode(params)}")
            page.wait_for_load_state("networkidle")
            page.wait_for_timeout(2000)   # the graphs draw after their data came
            # Its navigation bar is fixed: a window as tall as the page draws it once, at the top.
            page.set_viewport_size({"width": 1280, "height": page.evaluate("document.body.scrollHeight")})
            png.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(png))
            browser.close()
    return answers


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("om", type=Path, nargs="?", help="--picture: the PNG")
    parser.add_argument("--work", type=Path, default=Path("/tmp/monitoring-feed"))
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--picture", action="store_true", help="Prometheus' graphs of the feed OUT as the PNG")
    args = parser.parse_args()
    if args.picture:
        answers = picture(args.out, args.om)
        print(json.dumps({title: len(series) for title, series in answers.items()}), flush=True)
        return
    args.work.mkdir(parents=True, exist_ok=True)
    feed(args.out, args.work, args.tiny)


if __name__ == "__main__":
    main()
