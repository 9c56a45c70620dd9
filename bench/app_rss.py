"""Does the page's server process grow with every job? Many small jobs through the API, its RSS sampled.

    python bench/app_rss.py OUT.json [--jobs 200] [--every 25]

Starts the app as users start it (self-test model, a fresh outputs folder, no browser), runs ``--jobs``
text-to-video jobs one after another through gradio_client (each a new client, as a new visitor would
be, every fifth one a still, every tenth one refused for a bad setting), and records the resident memory
of the app process (not the engine's) after every ``--every`` jobs, after a warm-up of ten jobs.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import psutil  # noqa: E402
from gradio_client import Client  # noqa: E402

from tests.conftest import running_app  # noqa: E402

WARM_UP = 10


def job(url: str, number: int, client: Client | None = None) -> None:
    client = client or Client(url, verbose=False)
    args = ["selftest-t2v", f"job {number}", "", "selftest-t2v", 64, 64, 9, 2, 5.0, 3.0, number]
    if number % 10 == 9:
        args[4] = 70   # refused: not a multiple of 16
        try:
            client.predict(*args, api_name="/text_to_video")
        except Exception:
            pass
        return
    client.predict(*args, api_name="/text_to_image" if number % 5 == 4 else "/text_to_video")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--every", type=int, default=25)
    parser.add_argument("--one-client", action="store_true", help="one visitor for every job, not a new one each")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="app-rss-"))
    samples = []
    with running_app(work / "app.log", "--model", "selftest-t2v", "--outputs", str(work / "outputs"),
                     "--models-dir", str(work / "models"), "--latents-hours", "0") as (url, proc):
        app = psutil.Process(proc.pid)
        client = Client(url, verbose=False) if args.one_client else None
        for number in range(WARM_UP):
            job(url, number, client)
        start = time.time()
        for number in range(args.jobs):
            if number % args.every == 0:
                samples.append({"jobs": number, "rss_mb": round(app.memory_info().rss / 2 ** 20, 2),
                                "seconds": round(time.time() - start, 1)})
                print(samples[-1], flush=True)
            job(url, WARM_UP + number, client)
        samples.append({"jobs": args.jobs, "rss_mb": round(app.memory_info().rss / 2 ** 20, 2),
                        "seconds": round(time.time() - start, 1)})
    half = len(samples) // 2
    growth_all = (samples[-1]["rss_mb"] - samples[0]["rss_mb"]) / args.jobs
    growth_late = (samples[-1]["rss_mb"] - samples[half]["rss_mb"]) / (args.jobs - samples[half]["jobs"])
    result = {"jobs": args.jobs, "warm_up": WARM_UP, "one_client": args.one_client, "samples": samples,
              "growth_mb_per_job": round(growth_all, 4), "growth_mb_per_job_second_half": round(growth_late, 4)}
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps({k: v for k, v in result.items() if k != "samples"}))


if __name__ == "__main__":
    main()
