"""What a real browser does with the guard's answers: no page or script among the outputs runs, and a page on
another site cannot make the browser upload to the app (issue findings 4 and 6)."""
from __future__ import annotations

import functools
import http.server
import threading
from pathlib import Path

import pytest

from tests.conftest import ROOT, free_port, open_page
from tests.helpers.page import generate

SCRIPT = "try { (window.parent || window).ran_{name} = true } catch (e) {}; document.title = 'ran {name}'"
TRAPS = {
    "html": "<html><body><script>{script}</script></body></html>",
    "xhtml": '<html xmlns="http://www.w3.org/1999/xhtml"><body><script>{script}</script></body></html>',
    "svg": '<svg xmlns="http://www.w3.org/2000/svg"><script>{script}</script></svg>',
    "js": "{script}",
    "mjs": "{script}",
}


def test_no_page_or_script_among_the_outputs_runs(browser, app_server):
    outputs = Path(app_server["outputs"])
    urls = {}
    for name, text in TRAPS.items():
        trap = outputs / f"trap.{name}"
        trap.write_text(text.replace("{script}", SCRIPT.replace("{name}", name)))
        urls[name] = f"/gradio_api/file={trap.resolve()}"
        urls[f"{name}-route"] = f"/gradio_api/file/{trap.resolve()}"   # gradio's other file route
    with open_page(browser, app_server["url"]) as page:
        # A result of its own, to show that media still plays inline.
        page.locator("#t2v-prompt textarea").fill("a fox")
        generate(page)
        page.wait_for_function("() => /Done in/.test(document.querySelector('#t2v-status').innerText)",
                               timeout=120_000)
        video = next(outputs.rglob("*.mp4"))
        page.evaluate("""([urls, video]) => {
            for (const name of ["html", "xhtml", "svg", "html-route", "xhtml-route", "svg-route"]) {
                const frame = document.createElement("iframe"); frame.src = urls[name]; document.body.append(frame);
            }
            for (const name of ["js", "js-route"]) {
                const classic = document.createElement("script"); classic.src = urls[name]; document.body.append(classic);
            }
            const module = document.createElement("script"); module.type = "module"; module.src = urls.mjs;
            document.body.append(module);
            const player = document.createElement("video"); player.id = "probe-video"; player.src = video;
            document.body.append(player);
        }""", [urls, f"/gradio_api/file={video.resolve()}"])
        page.wait_for_function("document.getElementById('probe-video').readyState >= 1", timeout=30_000)
        page.wait_for_timeout(1500)
        ran = page.evaluate("['html', 'xhtml', 'svg', 'js', 'mjs'].filter(n => window['ran_' + n])")
        assert ran == [], f"these ran as pages or scripts: {ran}"
        assert not page.title().startswith("ran")


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def another_site(tmp_path):
    """A page on another origin (another port of this machine), as any site the user visits would be."""
    port = free_port()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port),
                                             functools.partial(_Quiet, directory=str(tmp_path)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield tmp_path, f"http://localhost:{port}"
    server.shutdown()


SEND_UPLOADS = """async (target) => {
    const sent = [];
    for (let n = 0; n < 4; n++) {
        const form = new FormData();
        form.append("files", new Blob([new Uint8Array(1024 * 1024)]), `cross-site-${n}.bin`);
        sent.push(fetch(target + "gradio_api/upload", {method: "POST", mode: "no-cors", body: form})
            .then(() => "sent", e => String(e)));
    }
    sent.push(fetch(target + "gradio_api/queue/join", {method: "POST", mode: "no-cors",
        body: JSON.stringify({data: [], fn_index: 0, session_hash: "cross-site"})}).then(() => "sent", e => String(e)));
    return Promise.all(sent);
}"""


def test_a_page_on_another_site_cannot_upload_to_a_password_less_app(browser, app_server, another_site):
    folder, origin = another_site
    (folder / "page.html").write_text("<html><body>another site</body></html>")
    served = ROOT / ".served"
    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(f"{origin}/page.html")
        answers = page.evaluate(SEND_UPLOADS, app_server["url"])
        assert answers == ["sent"] * 5          # the browser sent them (no-cors: it shows the site no answer)
        page.wait_for_timeout(500)
        assert not list(served.rglob("cross-site-*.bin")), "another site's uploads landed on the server"
        # The same requests from the app's own page do land: the test would see it if they had.
        page.goto(app_server["url"])
        page.evaluate(SEND_UPLOADS, app_server["url"])
        page.wait_for_timeout(500)
        assert len(list(served.rglob("cross-site-*.bin"))) >= 1
    finally:
        context.close()
