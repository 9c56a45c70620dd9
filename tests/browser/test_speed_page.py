"""The speed work on the page: the speed choices under the plan, the machine measured at the first job, then the
time a video takes said before Generate and drawn beside what each phase took. Real Chromium, with screenshots."""
from __future__ import annotations

import pytest

from tests.conftest import Screenshots, open_page, running_app
from tests.helpers.page import generate, set_number


@pytest.fixture(scope="module")
def measuring_app(tmp_path_factory, selftest_models_dir):
    """The app as users run it: it measures the machine before its first job (the suite turns that off)."""
    outputs = tmp_path_factory.mktemp("speed-outputs")
    log = tmp_path_factory.mktemp("speed-logs") / "app.log"
    with running_app(log, "--model", "selftest-t2v", "--outputs", str(outputs), "--models-dir",
                     str(selftest_models_dir), env={"WAN_STUDIO_CALIBRATE": "1"}) as (url, _):
        yield {"url": url, "outputs": outputs}


def _plan_text(page) -> str:
    return page.locator("#t2v-plan").inner_text()


def test_the_first_job_measures_the_machine_then_the_page_says_how_long_a_video_takes(browser, measuring_app,
                                                                                    shot: Screenshots):
    with open_page(browser, measuring_app["url"]) as page:
        for elem in ("t2v-decoder", "t2v-step-cache", "t2v-compile", "t2v-attention", "t2v-vae-precision"):
            assert page.locator(f"#{elem}").is_visible(), elem
        page.wait_for_function("() => document.querySelector('#t2v-plan').innerText.includes('Strategy')")
        assert "About" not in _plan_text(page)          # nothing measured yet: no guess
        page.locator("#t2v-prompt textarea").fill("a lighthouse at dusk")
        generate(page)
        page.wait_for_function("() => document.querySelector('#t2v-timings').innerText.includes('Total')",
                               timeout=120_000)
        assert "Measure this machine (once)" in page.locator("#t2v-timings").inner_text()
        assert (measuring_app["outputs"] / ".calibration.json").is_file()
        set_number(page, "t2v-width", 96)           # the plan is worked out again, now with this machine's speed
        page.wait_for_function("() => document.querySelector('#t2v-plan').innerText.includes('About')")
        assert "when the model is already loaded" in _plan_text(page)
        generate(page)
        page.wait_for_function("() => !document.querySelector('#t2v-timings').innerText.includes('Measure')",
                               timeout=120_000)        # the second job's table
        page.wait_for_function("() => document.querySelector('#t2v-timings').innerText.includes('Total')",
                               timeout=120_000)
        assert page.locator("#t2v-timing-chart .wan-predicted").count() >= 3
        chart = page.locator("#t2v-timing-chart").inner_text()
        assert "predicted" in chart and "Measure this machine" not in page.locator("#t2v-timings").inner_text()
        shot(page, "t2v-predicted-times")
