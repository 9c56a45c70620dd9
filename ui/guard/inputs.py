"""The file inputs of a call to the page's functions, checked as gradio will check them, before gradio does.

gradio validates each input of a component that holds files (an image, a video) against that component's data
model before the function runs, and answers a value that is not such a record with ``{"error": null}`` and a
traceback in the console: no sentence for the caller. This reads the same call (the function by its API name or
its index, its ``data``) and refuses such a value first, naming the input and what to send.
"""
from __future__ import annotations

from ui.guard.reading import Refused

# What a caller sends for a file input (an image's is {"path": ..., "meta": {"_type": "gradio.FileData"}}, a
# video's {"video": that}).
FILE_RECORD = ("an uploaded file's record as gradio_client's handle_file makes it (with the path POST "
               "/gradio_api/upload answered), or null")
# The components whose values are file records.
FILE_COMPONENTS = ("Image", "Video", "File", "Audio", "Gallery")


def _function(blocks, reading):
    """The page's function a call names (None: none, or a call of no function)."""
    body = reading.value if isinstance(reading.value, dict) else {}
    api = reading.params.get("api")
    fns = getattr(blocks, "fns", {}) or {}
    if api:
        return next((fn for fn in fns.values() if getattr(fn, "api_name", None) == api), None)
    index = body.get("fn_index")
    return fns.get(index) if isinstance(index, int) and not isinstance(index, bool) else None


def check_file_inputs(gradio, reading) -> None:
    """Refused (400) when an input of a component that holds files is given something that is no file record."""
    from pydantic import ValidationError

    blocks = getattr(gradio, "get_blocks", lambda: None)()
    body = reading.value if isinstance(reading.value, dict) else {}
    data = body.get("data")
    fn = _function(blocks, reading) if blocks is not None else None
    if fn is None or not isinstance(data, list):
        return
    for number, (block, value) in enumerate(zip(getattr(fn, "inputs", ()), data), 1):
        model = getattr(block, "data_model", None)
        if model is None or value is None or getattr(block, "stateful", False):
            continue
        try:
            model.model_validate(value, context={"validate_meta": True})
        except (ValidationError, ValueError, TypeError):
            name = getattr(block, "label", None) or f"input {number}"
            kind = type(block).__name__
            takes = FILE_RECORD if kind in FILE_COMPONENTS else f"the value a {kind} takes"
            raise Refused(400, f"The {name!r} input takes {takes}; it was given {type(value).__name__} "
                               f"{str(value)[:40]!r}.") from None
