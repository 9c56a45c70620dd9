"""A real Prometheus server scraping the app with docs/monitoring/prometheus.yml as a user copies it (only the
address, the password file and the pace changed): the job counter read back through Prometheus' own HTTP API,
every query of docs/monitoring/grafana-dashboard.json answered, and Prometheus' graph page of those queries in the
real browser (the screenshot the README shows)."""
from __future__ import annotations

import json
import time
import urllib.parse

import httpx
import pytest
import yaml

from engine.service.metrics import OUTCOMES
from tests.conftest import selftest_app
from tests.helpers.monitoring import MONITORING, query, started_prometheus, wait_for

USER, PASSWORD = "wan", "a-long-secret-3"
SMALL = {"mode": "t2v", "prompt": "a red fox", "model": "selftest-t2v", "width": 64, "height": 64, "frames": 9,
         "steps": 2}
# The dashboard's panels whose queries have data on a CPU once jobs ran (GPU utilisation and VRAM need a GPU; the
# failed share needs a failed job).
ANSWERED_ON_A_CPU = {"Jobs done (last hour)", "Waiting in the queue", "Loaded model", "Jobs by outcome", "Job time",
                     "Seconds per phase", "Engine state", "Engine RAM", "Failures by kind", "Refusals by kind",
                     "Queue wait"}


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, query) of every target of the dashboard, its variables as Grafana would fill them: every
    instance, a rate window of a minute."""
    board = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    return [(panel["title"], target["expr"].replace("$instance", ".+").replace("$__rate_interval", "1m"))
            for panel in board["panels"] for target in panel.get("targets", ())]


@pytest.fixture(scope="module")
def app(tmp_path_factory, selftest_models_dir):
    with selftest_app(tmp_path_factory, selftest_models_dir, "monitoring", "--auth", f"{USER}:{PASSWORD}") as app:
        yield app


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory, app):
    """Prometheus started with the README's scrape config, scraping the app every second."""
    folder = tmp_path_factory.mktemp("prometheus")
    config = yaml.safe_load((MONITORING / "prometheus.yml").read_text())
    config["global"].update(scrape_interval="1s", scrape_timeout="1s")
    (scrape,) = config["scrape_configs"]
    (folder / "password").write_text(PASSWORD + "\n")
    scrape["basic_auth"]["password_file"] = str(folder / "password")
    scrape["static_configs"][0]["targets"] = [urllib.parse.urlsplit(app["url"]).netloc]
    with started_prometheus(folder, config) as started:
        yield started


def done_jobs(prometheus: dict) -> float:
    found = query(prometheus, 'sum(wan_studio_jobs_total{job="wan-studio", outcome="done"})')
    return float(found[0]["value"][1]) if found else 0.0


def run_job(http: httpx.Client, **body) -> None:
    made = http.post("/api/v1/jobs", json={**SMALL, **body})
    assert made.status_code == 202, made.text
    wait_for(lambda: http.get(f"/api/v1/jobs/{made.json()['id']}").json()["state"] == "done", 120)


def test_prometheus_scrapes_the_app_and_answers_every_dashboard_query(app, prometheus, browser, shot):
    target = wait_for(lambda: [t for t in httpx.get(f"{prometheus['url']}/api/v1/targets").json()["data"]
                                ["activeTargets"] if t["health"] == "up"], 30,
                       lambda: httpx.get(f"{prometheus['url']}/api/v1/targets").text)
    assert target[0]["labels"]["job"] == "wan-studio"        # logged in with the password file: up, not 401
    with httpx.Client(base_url=app["url"], auth=(USER, PASSWORD), timeout=120) as http:
        run_job(http)
        wait_for(lambda: done_jobs(prometheus) == 1, 30)    # the first job, read back through Prometheus
        time.sleep(2)
        for steps in (3, 4):                                 # more jobs once the series exist: rates of them
            run_job(http, steps=steps)
        assert http.post("/api/v1/jobs", json={**SMALL, "width": 70}).status_code == 422
    wait_for(lambda: done_jobs(prometheus) == 3, 30)
    # Every bounded series is there from the start, at 0: the refused job's is the one that moved.
    refused = wait_for(lambda: [r for r in query(prometheus, 'wan_studio_jobs_total{outcome="refused"}')
                                 if float(r["value"][1])], 30)
    assert [float(r["value"][1]) for r in refused] == [1.0] and refused[0]["metric"]["mode"] == "t2v"
    time.sleep(3)                                            # a few scrapes after the last job, for the rates

    answered = {}
    for title, expr in dashboard_queries():
        answered.setdefault(title, []).append(query(prometheus, expr))
    assert set(ANSWERED_ON_A_CPU) < set(answered)
    for title in ANSWERED_ON_A_CPU:
        assert all(answered[title]), (title, answered[title])
    assert {r["metric"]["model"] for r in answered["Loaded model"][0]} == {"selftest-t2v"}
    assert {r["metric"]["outcome"] for r in answered["Jobs by outcome"][0]} == set(OUTCOMES)   # each from 0
    assert {r["metric"]["outcome"] for r in answered["Jobs by outcome"][0] if float(r["value"][1])} <= {"done",
                                                                                                       "refused"}
    median = answered["Job time"][0]
    assert median[0]["metric"]["mode"] == "t2v" and 0 < float(median[0]["value"][1]) <= 20
    assert {r["metric"]["state"] for r in answered["Engine state"][0]} == {"idle"}
    phases = {r["metric"]["phase"]: float(r["value"][1]) for r in answered["Seconds per phase"][0]}
    assert {"denoise", "vae_decode", "export"} <= set(phases) and all(v >= 0 for v in phases.values())

    graphs = [expr for title, expr in dashboard_queries() if title in
              ("Jobs by outcome", "Job time", "Seconds per phase", "Engine RAM")][:5]
    params = {}
    for number, expr in enumerate(graphs):
        params.update({f"g{number}.expr": expr, f"g{number}.tab": "0", f"g{number}.range_input": "1m"})
    context = browser.new_context(viewport={"width": 1440, "height": 1000})
    page = context.new_page()
    try:
        page.goto(f"{prometheus['url']}/graph?{urllib.parse.urlencode(params)}")
        page.wait_for_load_state("networkidle")
        page.wait_for_timeout(1500)                          # the graphs draw after their data came
        body = page.locator("body").inner_text()
        assert "wan_studio_jobs_total" in body or "wan_studio_jobs_total" in page.content()
        assert "Error" not in body.split("wan_studio")[0]
        # Its navigation bar is fixed: a window as tall as the page draws it once, at the top.
        page.set_viewport_size({"width": 1440, "height": page.evaluate("document.body.scrollHeight")})
        shot(page, "prometheus-dashboard-queries", full_page=False)
    finally:
        context.close()
