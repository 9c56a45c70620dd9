"""Calling a running app's gradio API raw: every input the endpoints want, and one call through its REST route."""
from __future__ import annotations

import httpx

I2V_TAIL = ["selftest-i2v", "waves", "", "selftest-i2v", 64, 64, 9, 2, 5.0, 3.0, 1]
# The raw API wants every input, the plan overrides included (gradio_client fills them in itself).
OVERRIDES = ["Auto", "Auto", "Auto", "vae", "Off", "Auto", "Auto", "Auto", "", "(the model's own)",
             "(the model's own)", "Auto", 0, 0, 16, 1, 1, 1, "Auto", "exact"]
# (the plan panel's dropdowns, LoRAs, transformer files, GPUs, Guidance 2, the window and overlap, the count,
# smoother and larger, the guidance batch and the linears)
GPUS_AT = 11   # the GPUs choice's place in OVERRIDES


def call_api(app, api_name: str, data: list, timeout: float = 60) -> str:
    """Everything the server sends back for one call through the /call REST route."""
    base = app["url"] + f"gradio_api/call/{api_name}"
    with httpx.Client(timeout=timeout) as http:
        posted = http.post(base, json={"data": data})
        if posted.status_code != 200:
            return posted.text
        text = posted.text
        with http.stream("GET", f"{base}/{posted.json()['event_id']}") as stream:
            lines = stream.iter_lines()
            for line in lines:
                text += line + "\n"
                if line.startswith(("event: complete", "event: error")):
                    text += next(lines, "")   # its data line
                    break
    return text


def api_client(url: str, **options):
    """A gradio_client Client of ``url`` whose calls, when every earlier call has its answer, first wait for the
    event stream of those calls to close (at most STREAM_CLOSE_S). gradio_client 2.7.2 gives a call sent while the
    server is closing that stream to the closing stream and then cancels it (``CancelledError`` from a /history call
    right after a /larger one, on a busy machine); the server closes it a few milliseconds after the last answer.
    While a call is still going on, the stream stays open and a new call joins it, as before."""
    import time

    from gradio_client import Client

    class Settled(Client):
        def submit(self, *args, **kwargs):
            deadline = time.monotonic() + STREAM_CLOSE_S
            while self.stream_open and not self.pending_event_ids and time.monotonic() < deadline:
                time.sleep(0.01)
            return super().submit(*args, **kwargs)

    return Settled(url, verbose=False, **options)


STREAM_CLOSE_S = 5
