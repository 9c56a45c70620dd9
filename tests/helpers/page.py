"""The page driven as a person drives it, in a real browser (Playwright): tabs, boxes, choices, what it says."""
from __future__ import annotations

from contextlib import contextmanager


def set_number(page, elem_id: str, value) -> None:
    box = page.locator(f"#{elem_id} input")
    box.fill(str(value))
    box.press("Tab")


def table_text(page, elem_id: str) -> str:
    return page.locator(f"#{elem_id}").inner_text()


def set_text(page, elem_id: str, value: str) -> None:
    box = page.locator(f"#{elem_id}").locator("input, textarea").first
    box.fill(value)
    box.press("Tab")


def status(page, prefix: str = "t2v") -> str:
    """The status as a person reads it (gradio's hidden status overlay left out)."""
    return page.locator(f"#{prefix}-status [data-testid=markdown]").inner_text()


def no_error_badge(page, elem_id: str) -> bool:
    """gradio's red "Error" badge on a component: absent, or in its hidden (transparent) overlay."""
    return page.evaluate("""id => [...document.querySelectorAll(`#${id} .error`)].every(e => {
        for (let p = e; p && p.id !== id; p = p.parentElement) {
            const style = getComputedStyle(p);
            if (style.opacity === '0' || style.display === 'none' || style.visibility === 'hidden') return true;
        }
        return false; })""", elem_id)


def toasts(page) -> list[str]:
    return page.evaluate("() => [...document.querySelectorAll('.toast-body')].map(t => t.innerText)")


def generate(page, prefix: str = "t2v") -> None:
    """Press the tab's Generate once its last job's events have all ended (its Cancel back to grey). The status
    says "Done" before the page has heard the job's event end, and until then the page sends no click of that
    button: a click in that moment would start nothing. (The still's button shares the Text to Video tab's Cancel.)"""
    tab = "t2v" if prefix == "t2i" else prefix
    page.wait_for_function("id => document.querySelector(`#${id}-cancel`).className.includes('secondary')", arg=tab,
                           timeout=60_000)
    page.locator(f"#{prefix}-generate").click()


def open_tab(page, name: str) -> None:
    page.get_by_role("tab", name=name).click()


LONG_JOB = {"width": 256, "height": 256, "frames": 33, "steps": 200}   # minutes of the self-test model on any CPU


@contextmanager
def long_job(page, prompt: str, **numbers):
    """Text to Video with ``prompt``, 200 steps at 256x256x33 (or the ``t2v-<name>`` numbers given), started and
    seen running: the status line shows a step (it updates every step, unlike the 2 s system panel). The job cannot
    end before the test cancels it, however fast the machine, so a test never allows for a job that finished. On
    leaving, the form's numbers are put back as they were, for the file's next test on the same page."""
    numbers = {**LONG_JOB, **numbers, "steps": 200}
    earlier = {name: page.locator(f"#t2v-{name} input").input_value() for name in numbers}
    page.locator("#t2v-prompt textarea").fill(prompt)
    for name, value in numbers.items():
        set_number(page, f"t2v-{name}", value)
    generate(page)
    page.wait_for_function("() => /step \\d+\\/200/.test(document.querySelector('#t2v-status').innerText)")
    yield
    if not page.is_closed():
        for name, value in earlier.items():
            set_number(page, f"t2v-{name}", value)


def choose(page, elem_id: str, option: str) -> None:
    page.locator(f"#{elem_id} input").click()
    page.locator(f"#{elem_id}").get_by_role("option", name=option, exact=True).click()



# Every page the tests open counts the animation frames it asks the browser for (installed before gradio's code
# runs, which keeps its own reference to the browser's function).
COUNT_FRAMES = """(() => {
    window.__framesAsked = 0;
    const own = window.requestAnimationFrame;
    window.requestAnimationFrame = (callback) => { window.__framesAsked++; return own.call(window, callback); };
})();"""
# How many it asks for a second, over two seconds: a page at rest asks for none; each status tracker left counting
# behind a component an event hid with visible=False (ui/parts/visibility.py) would ask for 60, for as long as the
# page stays open, were its count not on a timer (ui/status_clock.py).
FRAMES_ASKED = """async () => {
    const before = window.__framesAsked;
    await new Promise((done) => setTimeout(done, 2000));
    return (window.__framesAsked - before) / 2; }"""


def frames_asked_per_second(page) -> float:
    return page.evaluate(FRAMES_ASKED)
