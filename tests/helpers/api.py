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
