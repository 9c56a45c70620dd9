"""/metrics on a real server, read with Prometheus' own parser: the login it takes (or none with --metrics-public),
the job counters and histograms after a done, a refused and a failed job, from the JSON API and from the page, and
the gauges of the engine that ran them."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import ROOT, running_app

pytestmark = pytest.mark.server

USER, PASSWORD = "wan", "a-long-secret-2"
TOKEN = "token-for-prometheus-0123456789"
SMALL = {"model": "selftest-t2v", "width": 64, "height": 64, "frames": 9, "steps": 2}
T2V = ("mode", "t2v"), ("model", "selftest-t2v")


@pytest.fixture(scope="module")
def models(tmp_path_factory, selftest_models_dir):
    """The self-test models, and a LoRA in their loras/ whose every value is finite and far too large: it passes
    the check of its values, then the denoise overflows (a job that fails while it runs)."""
    import torch
    from safetensors.torch import save_file

    from tests.helpers.loras import diffusers_lora

    folder = tmp_path_factory.mktemp("metrics-models")
    shutil.copytree(selftest_models_dir, folder, dirs_exist_ok=True)
    (folder / "loras").mkdir(exist_ok=True)   # another test may have put LoRAs in the shared folder
    save_file({name: torch.full_like(tensor, 1e20) for name, tensor in diffusers_lora().items()},
              folder / "loras" / "overcooked.safetensors")
    return folder


@pytest.fixture(scope="module")
def server(tmp_path_factory, models):
    folder = tmp_path_factory.mktemp("metrics")
    (folder / "tokens.txt").write_text(TOKEN + "\n")
    with running_app(folder / "app.log", "--model", "selftest-t2v", "--outputs", str(folder / "outputs"),
                     "--models-dir", str(models), "--auth", f"{USER}:{PASSWORD}", "--api-token",
                     str(folder / "tokens.txt")) as (url, proc):
        yield {"url": url}


def scrape(url: str, **login) -> dict[tuple, float]:
    """Every sample of /metrics as Prometheus' parser reads it: (name, sorted labels) -> value."""
    answer = httpx.get(f"{url.rstrip('/')}/metrics", timeout=30, **login)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/plain; version=")   # Prometheus' text format
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(answer.text) for sample in family.samples}


def value(samples: dict, name: str, *labels: tuple) -> float:
    return samples.get((name, tuple(sorted(labels))), 0.0)


def one_state(samples: dict) -> str:
    ones = [dict(labels)["state"] for (name, labels), v in samples.items()
            if name == "wan_studio_engine_state" and dict(labels)["engine"] == "0" and v == 1]
    assert len(ones) == 1, ones
    return ones[0]


def job(http: httpx.Client, **body) -> dict:
    """A job through the JSON API, waited for to its end; its last status."""
    made = http.post("/api/v1/jobs", json={"mode": "t2v", "prompt": "a red fox", **SMALL, **body})
    assert made.status_code == 202, made.text
    deadline = time.time() + 180
    while time.time() < deadline:
        status = http.get(f"/api/v1/jobs/{made.json()['id']}").json()
        if status["state"] in ("done", "failed", "cancelled"):
            return status
        time.sleep(0.2)
    raise AssertionError(status)


def test_metrics_take_the_page_s_login_or_a_token(server):
    url = server["url"].rstrip("/") + "/metrics"
    for login in ({}, {"auth": (USER, "wrong-password")}, {"headers": {"Authorization": "Bearer not-a-token"}}):
        refused = httpx.get(url, timeout=30, **login)
        assert refused.status_code == 401, (login, refused.text)
        assert refused.headers["www-authenticate"].startswith("Basic")
        assert "wan_studio" not in refused.text
    assert scrape(server["url"], auth=(USER, PASSWORD))
    samples = scrape(server["url"], headers={"Authorization": f"Bearer {TOKEN}"})
    assert ("wan_studio_queue_waiting", ()) in samples


def test_a_done_a_refused_and_a_failed_job_each_move_their_counter_by_one(server):
    before = scrape(server["url"], auth=(USER, PASSWORD))
    with httpx.Client(base_url=server["url"], auth=(USER, PASSWORD), timeout=120) as http:
        assert job(http)["state"] == "done"
        refused = http.post("/api/v1/jobs", json={"mode": "t2v", "prompt": "a red fox", **SMALL, "width": 70})
        assert refused.status_code == 422, refused.text
        unread = http.post("/api/v1/jobs", json={"mode": "t2v", "prompt": "a red fox", "steps": "many"})
        assert unread.status_code == 422, unread.text            # refused while its body was read
        failed = job(http, loras="overcooked.safetensors: 1")
        assert failed["state"] == "failed", failed
    after = scrape(server["url"], auth=(USER, PASSWORD))

    def moved(name: str, *labels: tuple) -> float:
        return value(after, name, *labels) - value(before, name, *labels)

    assert moved("wan_studio_jobs_total", *T2V, ("outcome", "done")) == 1
    assert moved("wan_studio_jobs_total", ("mode", "t2v"), ("model", ""), ("outcome", "refused")) == 2
    assert moved("wan_studio_jobs_total", *T2V, ("outcome", "failed")) == 1
    assert moved("wan_studio_refusals_total", ("kind", "input")) == 2      # refused, apart from the failures
    assert moved("wan_studio_errors_total", ("kind", "input")) == 0
    assert moved("wan_studio_errors_total", ("kind", "values")) == 1       # the overflow, by its kind
    # The done and the failed job ran (the refused ones never did): both timed, the done one's phases too.
    assert moved("wan_studio_job_seconds_count", *T2V) == 2
    assert moved("wan_studio_job_seconds_sum", *T2V) > 0
    assert moved("wan_studio_queue_wait_seconds_count") == 2
    for phase in ("text_encode", "denoise", "vae_decode", "export"):
        assert moved("wan_studio_phase_seconds_count", T2V[1], ("phase", phase)) >= 1, phase
    assert value(after, "wan_studio_phase_seconds_bucket", ("phase", "denoise"), ("le", "+Inf")) == \
        value(after, "wan_studio_phase_seconds_count", ("phase", "denoise"))


def test_the_engine_s_gauges_after_a_job_and_a_page_job_counted_as_a_still(server):
    from gradio_client import Client

    page = Client(server["url"], auth=(USER, PASSWORD), verbose=False)
    before = scrape(server["url"], auth=(USER, PASSWORD))
    page.predict("selftest-t2v", "a red fox", "", "selftest-t2v", 64, 64, 9, 2, 5.0, 3.0, 7,
                 api_name="/text_to_image")
    samples = scrape(server["url"], auth=(USER, PASSWORD))
    assert value(samples, "wan_studio_jobs_total", ("mode", "t2i"), ("model", "selftest-t2v"), ("outcome", "done")) \
        == value(before, "wan_studio_jobs_total", ("mode", "t2i"), ("model", "selftest-t2v"), ("outcome", "done")) + 1
    assert one_state(samples) == "idle"
    assert value(samples, "wan_studio_queue_waiting") == 0
    assert value(samples, "wan_studio_engine_ram_bytes", ("engine", "0")) > 100e6   # torch and a model, at least
    assert value(samples, "wan_studio_model_loaded", ("model", "selftest-t2v")) == 1
    # A CPU has no device memory and no GPU to be busy: those gauges are absent, not 0.
    assert not any(name.startswith(("wan_studio_vram", "wan_studio_gpu_utilization")) for name, _ in samples)


def test_metrics_public_opens_metrics_alone(tmp_path, selftest_models_dir):
    with running_app(tmp_path / "app.log", "--model", "selftest-t2v", "--outputs", str(tmp_path / "outputs"),
                     "--models-dir", str(selftest_models_dir), "--auth", f"{USER}:{PASSWORD}",
                     "--metrics-public") as (url, proc):
        samples = scrape(url)                                      # no login
        assert one_state(samples) in ("stopped", "starting", "idle")
        assert httpx.get(f"{url}api/v1/models", timeout=30).status_code == 401
        assert httpx.get(f"{url}config", timeout=30).status_code == 401       # nor the page's own
        # A real Prometheus with docs/monitoring/prometheus-local.yml as a user copies it (the address and the pace
        # changed) scrapes it: the config for an app without a password (the other one needs its password file).
        import urllib.parse

        import yaml

        from tests.helpers.monitoring import MONITORING, query, started_prometheus

        config = yaml.safe_load((MONITORING / "prometheus-local.yml").read_text())
        config["global"].update(scrape_interval="1s", scrape_timeout="1s")
        config["scrape_configs"][0]["static_configs"][0]["targets"] = [urllib.parse.urlsplit(url).netloc]
        (tmp_path / "prometheus").mkdir()
        with started_prometheus(tmp_path / "prometheus", config) as prometheus:
            deadline = time.time() + 30
            while not query(prometheus, 'wan_studio_queue_waiting{job="wan-studio"}'):
                assert time.time() < deadline, prometheus["log"].read_text()[-2000:]
                time.sleep(0.5)
            assert query(prometheus, 'up{job="wan-studio"}')[0]["value"][1] == "1"


def test_the_readme_s_look_from_the_terminal_works_as_written(server, tmp_path):
    text = (ROOT / "README.md").read_text()
    (block,) = re.findall(r"```bash\n(.*?)```", text[text.index("## Monitoring"):text.index("## Sharing with")], re.S)
    env = {**os.environ, "APP": server["url"].rstrip("/"), "LOGIN": f"{USER}:{PASSWORD}"}
    done = subprocess.run(["bash", "-ec", block], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "wan_studio_queue_waiting 0.0" in lines
    assert sum(line.startswith("wan_studio_engine_state{") for line in lines) == 5   # one engine, five states
