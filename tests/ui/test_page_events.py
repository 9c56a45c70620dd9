"""How the page's events are registered, read from the server app.py makes (in this process, no engine started):
what gradio does with each in a browser follows from it."""
from __future__ import annotations

import pytest

from ui.generate import GPU_QUEUE


@pytest.fixture(scope="module")
def page_functions(tmp_path_factory):
    import app
    from ui.serving import make_server
    from ui.startup import api_tokens, resolve_auth

    folder = tmp_path_factory.mktemp("page-events")
    args = app.parse_args(["--outputs", str(folder / "outputs"), "--models-dir", str(folder / "models"),
                           "--user-presets", str(folder / "user_presets")])
    (folder / "served").mkdir()
    server = make_server(args, folder / "served", resolve_auth(args), api_tokens(args.api_token))
    try:
        yield list(server.demo.fns.values())
    finally:
        server.engines.close()


def test_a_job_s_outputs_are_not_marked_as_waiting(page_functions):
    """A waiting output's tracker counts its seconds on every frame the browser draws (ui/generate.py gpu_event)."""
    jobs = [fn for fn in page_functions if fn.concurrency_id == GPU_QUEUE and fn.targets]   # the API's own: no page
    assert len(jobs) >= 8 and all(fn.show_progress_on == [] and fn.show_progress == "hidden" for fn in jobs)
