"""A JSON API job's body: read as the guard reads a page request (each key once), its fields the field table's
(engine/settings/fields.py: a setting by its name, the request's prompt, seed and images), its files as uploads
(multipart) or base64 in the JSON; and the same fields as a typed schema for the OpenAPI document.

Every value goes on as it came, for the one check the page and the command line share (engine/settings/draft.py,
check_request) to say what is wrong in its own sentences: "width 70 is not a multiple of 16 ...". Only what the body
is (its keys, its files) is checked here.
"""
from __future__ import annotations

import base64
import binascii
import json
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from engine.errors import InputError
from engine.settings.fields import FIELDS, SETTING_TYPES, Group, api_fields
from engine.settings.values import MODE_NAMES, MODES

# The request fields that are files: an image or a video, uploaded or in base64.
FILE_FIELDS = {"image": "image", "last_image": "image", "video": "video", "extend": "video"}
# What a file may be at most (the page's uploads' limit).
MAX_FILE_BYTES = 50 * 1024 * 1024
# The JSON body of a job is read with Python's json, where NaN and Infinity are numbers: the check refuses them with
# its sentence ("guidance must be a number, got nan") rather than a parser error.
DATA_URL = re.compile(r"^data:[\w/+.-]*;base64,", re.I)


class BodyError(InputError):
    """What is wrong with the body itself (not JSON, a key twice, an unknown field, a file that does not read)."""


def _names_for(mode: str) -> dict[str, str]:
    """{name a caller may give: field name} for a job of ``mode``: the fields its tab shows (by their field name and
    their API name: vae_dtype or vae_precision) and the settings the page leaves to the preset (fps, scheduler, ...)."""
    names = {}
    for one in (*api_fields(mode), *(f for f in FIELDS if f.group is not Group.REQUEST and f.place is None)):
        if mode in one.modes or one.place is None:
            names[one.name] = names[one.api_name] = one.name
    return names


def readable_fields(mode: str) -> list[str]:
    """The fields a job of ``mode`` takes, as a sentence lists them."""
    return sorted({name for name in _names_for(mode)} | {"mode"})


def parse_json_object(raw: bytes) -> dict:
    """The JSON object of a body, each key once (a key given twice is refused, as the guard refuses it)."""
    def once(pairs):
        found = {}
        for key, value in pairs:
            if key in found:
                raise BodyError(f"the body names {key!r} twice; give each field once")
            found[key] = value
        return found

    try:
        value = json.loads(raw or b"{}", object_pairs_hook=once)
    except BodyError:
        raise
    except (ValueError, RecursionError):
        raise BodyError("the body is not JSON: send an object such as {\"mode\": \"t2v\", \"prompt\": \"a fox\"}") \
            from None
    if not isinstance(value, dict):
        raise BodyError("the body must be a JSON object of fields, such as {\"mode\": \"t2v\", \"prompt\": \"a fox\"}")
    return value


@dataclass
class JobBody:
    """A job's body once read: its mode, its values by field name (files as paths of temporary copies) and the
    folder those copies are in (removed with ``discard`` once the job no longer needs them)."""
    mode: str
    values: dict
    folder: Path | None = None
    files: list[str] = field(default_factory=list)

    def discard(self) -> None:
        import shutil

        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)


def read_body(given: dict, uploads: dict[str, tuple[str, bytes]], resolve_output=None, plan: bool = False
              ) -> JobBody:
    """The job a body asks for: ``given`` its fields (the JSON object, or a form's text fields), ``uploads`` its
    files ({field: (file name, bytes)}); a file field may also be base64 text, or {"output": KEY} naming an output of
    the History (``resolve_output(key)`` gives its path). ``plan``: for the plan, which needs no prompt or files.
    BodyError saying what to change."""
    given = dict(given)
    mode = given.pop("mode", "t2v")
    if mode not in MODES:
        raise BodyError(f"mode {str(mode)[:40]!r} is not one of this app's: use " +
                        ", ".join(f"{m} ({MODE_NAMES[m]})" for m in MODES))
    names = _names_for(mode)
    unknown = sorted(set(given) - set(names)) + sorted(set(uploads) - set(FILE_FIELDS))
    if unknown:
        raise BodyError(f"{_listed(unknown)} {'is not a field' if len(unknown) == 1 else 'are not fields'} of a "
                        f"{MODE_NAMES[mode]} job: use {', '.join(readable_fields(mode))}")
    values = {names[name]: value for name, value in given.items()}
    body = JobBody(mode, values)
    files = {name: value for name, value in values.items() if name in FILE_FIELDS and value not in (None, "")}
    wanted = {**files, **{name: data for name, data in uploads.items()}}
    if plan and wanted:
        raise BodyError("the plan takes no files: leave the image and video fields out")
    for name, value in wanted.items():
        values[name] = _file(body, name, value, resolve_output)
    return body


def _listed(names: list[str]) -> str:
    return ", ".join(repr(str(name)[:40]) for name in names[:5]) + (" ..." if len(names) > 5 else "")


def _file(body: JobBody, name: str, value, resolve_output) -> str:
    """The path of the file a field gives: an upload or base64 written to the job's own temporary folder, or an
    output of the History by its key."""
    if isinstance(value, dict) and set(value) == {"output"} and resolve_output is not None:
        return resolve_output(value["output"])
    if isinstance(value, tuple):
        filename, data = value
    elif isinstance(value, str):
        filename, data = f"{name}.bin", _base64(name, value)
    else:
        raise BodyError(f"the {name.replace('_', ' ')} must be a file: upload it (multipart), give it in base64, or "
                        f"name an output as {{\"output\": \"<day>/<file>.mp4\"}}")
    if not data:
        raise BodyError(f"the {name.replace('_', ' ')} is empty: give the {FILE_FIELDS[name]}'s bytes")
    if len(data) > MAX_FILE_BYTES:
        raise BodyError(f"the {name.replace('_', ' ')} is {len(data) / 1e6:.0f} MB, more than the "
                        f"{MAX_FILE_BYTES / 1e6:.0f} MB an input may be")
    if body.folder is None:
        body.folder = Path(tempfile.mkdtemp(prefix="wan-api-"))
    suffix = Path(str(filename)).suffix.lower()[:8] if re.fullmatch(r"\.[a-z0-9]{1,7}",
                                                                      Path(str(filename)).suffix.lower()) else ""
    path = body.folder / f"{name}{suffix or ('.mp4' if FILE_FIELDS[name] == 'video' else '.png')}"
    path.write_bytes(data)
    body.files.append(str(path))
    return str(path)


def _base64(name: str, text: str) -> bytes:
    try:
        return base64.b64decode(DATA_URL.sub("", text.strip()), validate=True)
    except (binascii.Error, ValueError):
        raise BodyError(f"the {name.replace('_', ' ')} is not base64: give the file's bytes in base64 (a data: URL "
                        "too), or upload it as multipart") from None


# ----- the schema (OpenAPI) --------------------------------------------------------------------------------
_JSON_TYPES = {int: "integer", float: "number", str: "string", bool: "boolean", list: "array", tuple: "array",
               type(None): "null"}


def _field_schema(one) -> dict:
    """One field as JSON Schema: its type from the field table, its label and the values a choice takes."""
    if one.name in FILE_FIELDS:
        kind = FILE_FIELDS[one.name]
        schema = {"anyOf": [{"type": "string", "contentEncoding": "base64"},
                            {"type": "object", "properties": {"output": {"type": "string"}}}],
                  "description": f"{one.label}: the {kind} in base64, an upload (multipart), or an output by its key"}
    elif one.group is Group.REQUEST:
        schema = {"type": "integer" if one.name == "seed" else "string", "description": one.label}
    else:
        kinds = sorted({_JSON_TYPES[kind] for kind in SETTING_TYPES[one.name]})
        schema = {"type": kinds[0] if len(kinds) == 1 else kinds, "description": one.label}
    if one.choices and one.name not in FILE_FIELDS:
        schema["description"] += f" (one of: {', '.join(str(c) for c in one.choices if c is not None)})"
    return schema


def job_schema() -> dict:
    """The JSON Schema of a job's body: every field of the field table a job of some mode takes."""
    properties = {"mode": {"type": "string", "enum": list(MODES), "description": "what to make (default t2v): " +
                           ", ".join(f"{m} {MODE_NAMES[m]}" for m in MODES)}}
    for one in FIELDS:
        if one.name != "mode" and (one.place is not None or one.group is not Group.REQUEST):
            properties[one.api_name] = _field_schema(one)
    return {"type": "object", "properties": properties, "required": ["prompt"], "additionalProperties": False}
