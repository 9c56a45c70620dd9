"""Models tab: what the Hugging Face cache and the models folder hold (size, kind, the presets that use each);
download a repo or one file of it, with its progress; delete one after a confirmation.

A download checks the free disk space before its first byte. A delete takes only an entry of the list (never a
path typed in), only inside the models folder or the Hub cache, and never one that the running job uses or that a
loaded pipeline holds (its folder, transformer files, LoRAs, fast decoder; on any engine): the worker client says
what runs, each engine's status channel what it holds.
"""
from __future__ import annotations

import html
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import gradio as gr

from engine.device.usage import EngineSilent
from engine.models.download import DownloadError, download_file, download_snapshot, free_space, size_words
from engine.service.model_files import (DeleteRefused, LoadedFiles, ModelEntry, delete_entry, find_entry, list_models,
                                   names_in)
from engine.models.refs import REPO_ID, hub_cache_dir
from engine.errors import ModelError
from engine.models.single_file import TRANSFORMERS_FOLDER
from engine.models.fast_decoder_file import FAST_DECODER_FOLDER
from engine.settings.loras import LORAS_FOLDER
from ui.context import AppContext

COLUMNS = ["Name", "Kind", "Where", "Size", "Used by presets"]
# Where one file of a repo may go, inside the models folder (where the page's lists look for it).
FILE_FOLDERS = {f"models/{TRANSFORMERS_FOLDER}/ (a transformer file)": TRANSFORMERS_FOLDER,
                f"models/{LORAS_FOLDER}/ (a LoRA)": LORAS_FOLDER,
                f"models/{FAST_DECODER_FOLDER}/ (a fast decoder or light VAE)": FAST_DECODER_FOLDER}
# Seconds between two progress lines of a download.
PROGRESS_EVERY_S = 0.5
CONFIRM_FIRST = "Tick “Yes, delete it from disk” first: a delete cannot be undone."
PICK_FIRST = "Pick the model to delete in the Model list first."


def models_dir(ctx: AppContext) -> Path:
    return Path(ctx.models_dir or ctx.client.models_dir)


def entries(ctx: AppContext) -> list[ModelEntry]:
    return list_models(models_dir(ctx), dict(ctx.presets))


def table_rows(found: list[ModelEntry]) -> list[list[str]]:
    return [[e.name, e.kind, "Hub cache" if e.place == "hub" else "models folder", size_words(e.size_bytes),
             ", ".join(e.presets) or "-"] for e in found]


def summary(found: list[ModelEntry], free: dict[str, int]) -> str:
    """One line under the table: how many, how much disk they take, and the free space where downloads go."""
    room = ", ".join(f"{size_words(bytes_free)} free for {place}" for place, bytes_free in free.items())
    return f"**{len(found)} on disk, {size_words(sum(e.size_bytes for e in found))} in all** · {room}"


def free_where_downloads_go(ctx: AppContext) -> dict[str, int]:
    return {"the models folder": free_space(models_dir(ctx)), "the Hugging Face cache": free_space(hub_cache_dir())}


def names_in_use(ctx: AppContext) -> tuple[str, ...]:
    """The names of what the running jobs use, on every engine."""
    return tuple(name for running in ctx.client.all_running_settings() for name in names_in(running))


def loaded_files(ctx: AppContext) -> list[LoadedFiles]:
    """What each engine's loaded pipeline holds; DeleteRefused when an engine does not say (it is hung, or could
    not tell: what it holds is not known)."""
    found = ctx.client.all_loaded_files(timeout=2.0)
    if any(isinstance(held, EngineSilent) for held in found):
        raise DeleteRefused("an engine is not answering, so what it holds is not known; try again in a minute")
    if any(held is None for held in found):
        raise DeleteRefused("an engine could not tell which files it holds (it was changing its model); try again")
    return found


def delete_model(ctx: AppContext, key, confirmed) -> str:
    """Delete the listed entry ``key`` when ``confirmed``; what happened, in words."""
    if not isinstance(key, str) or not key:
        return PICK_FIRST
    if confirmed is not True:
        return CONFIRM_FIRST
    try:
        entry = find_entry(entries(ctx), key)
        return delete_entry(entry, models_dir(ctx), names_in_use(ctx), loaded=loaded_files(ctx))
    except ModelError as exc:
        return f"Not deleted: {html.escape(str(exc), quote=False)}"
    except OSError as exc:   # a file another program holds open (Windows), a folder without write permission
        return (f"Not deleted: {html.escape(str(key), quote=False)} could not be removed ({exc.strerror or exc}); "
                "close what uses it, or check the folder's permissions")


@dataclass
class _Transfer:
    """One download running in its own thread: its progress, and how it ended."""
    done: int = 0
    total: int = 0
    result: str | None = None
    started: float = field(default_factory=time.monotonic)

    def progress(self, done: int, total: int) -> None:
        self.done, self.total = done, total

    def line(self, what: str) -> str:
        if not self.total:
            return f"Downloading {what}: asking the Hub for its files..."
        rate = self.done / max(time.monotonic() - self.started, 1e-6)
        return (f"Downloading {what}: {size_words(self.done)} of {size_words(self.total)} "
                f"({100 * self.done / self.total:.0f} %, {size_words(int(rate))}/s)")


def download(ctx: AppContext, repo, path, into, free_bytes: int | None = None):
    """Download ``repo`` (or its file ``path`` into the models folder's ``into``), yielding progress lines."""
    repo = repo.strip() if isinstance(repo, str) else ""
    path = path.strip() if isinstance(path, str) else ""
    if not REPO_ID.match(repo):
        yield f"Not downloaded: {html.escape(repo[:80])!r} is not a Hugging Face repo id; write it as org/name."
        return
    if path and into not in FILE_FOLDERS:
        yield "Not downloaded: pick where the file goes from the list."
        return
    what = f"{repo}/{path}" if path else repo
    transfer = _Transfer()

    def work():
        try:
            if path:
                sub = FILE_FOLDERS[into]
                file = download_file(repo, path, models_dir(ctx) / sub, transfer.progress, free_bytes)
                where = "/".join(("models", *([sub] if sub else []), file.name))
            else:
                download_snapshot(repo, transfer.progress, free_bytes)
                where = "the Hugging Face cache (a preset finds it by its repo id)"
            transfer.result = f"Downloaded {what} into {where}."
        except (DownloadError, ModelError) as exc:   # ModelError: the repo's description says it cannot run
            transfer.result = f"Not downloaded: {html.escape(str(exc), quote=False)}"
        except Exception as exc:   # the page says what went wrong instead of an empty error
            transfer.result = f"Not downloaded: {type(exc).__name__}: {html.escape(str(exc), quote=False)}"

    thread = threading.Thread(target=work, name="model-download", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(PROGRESS_EVERY_S)
        if thread.is_alive():
            yield transfer.line(what)
    yield transfer.result


def _hub_models(ctx: AppContext) -> list[str]:
    return sorted({p.settings.model for p in ctx.presets.values() if REPO_ID.match(p.settings.model or "")})


def build(ctx: AppContext, tabs_select=None) -> None:
    """The tab; ``tabs_select`` (the tab's own select event) refreshes its list whenever it is opened."""
    gr.Markdown("What the Hugging Face cache and the models folder hold, with their size on disk and the presets "
                "that use them. Download a preset's model (a whole repo, into the Hugging Face cache) or one file "
                "of a repo (into the models folder); delete what you no longer need.")
    table = gr.Dataframe(headers=COLUMNS, value=[], interactive=False, elem_id="models-table", wrap=True)
    with gr.Row():
        total = gr.Markdown(elem_id="models-summary")
        refresh = gr.Button("Refresh", size="sm", elem_id="models-refresh", scale=0, min_width=120)
    gr.Markdown("### Download")
    with gr.Row():
        repo = gr.Dropdown(choices=_hub_models(ctx), value=None, allow_custom_value=True, label="Repo id (org/name)",
                           elem_id="models-repo", scale=3)
        path = gr.Textbox(label="One file of it (empty: the whole repo)", elem_id="models-file", scale=3,
                          placeholder="folder/name.safetensors")
        # Shown by the folder's name alone (the longer words did not fit beside the arrow); the values stay the
        # API's.
        into = gr.Dropdown(choices=[(f"{sub}/", key) for key, sub in FILE_FOLDERS.items()],
                           value=next(iter(FILE_FOLDERS)), label="A file goes into models/…", elem_id="models-into",
                           scale=2)
    download_btn = gr.Button("Download", variant="primary", elem_id="models-download")
    progress = gr.Markdown(elem_id="models-progress", elem_classes=["wan-status"])
    gr.Markdown("### Delete")
    with gr.Row():
        # Any value is taken here and looked up in the list on the server (find_entry): nothing else is deleted.
        choice = gr.Dropdown(choices=[], label="Model", elem_id="models-choice", scale=4, allow_custom_value=True)
        confirm = gr.Checkbox(label="Yes, delete it from disk", value=False, elem_id="models-confirm", scale=1)
    delete_btn = gr.Button("Delete", variant="stop", elem_id="models-delete")
    deleted = gr.Markdown(elem_id="models-deleted", elem_classes=["wan-status"])

    def listing(keep=None):
        """The table, its summary and the Model list, still on ``keep`` while it is listed."""
        found = entries(ctx)
        return (table_rows(found), summary(found, free_where_downloads_go(ctx)),
                gr.Dropdown(choices=[(f"{e.name} ({e.kind})", e.key) for e in found],
                            value=keep if keep in [e.key for e in found] else None))

    def delete(key, confirmed):
        said = delete_model(ctx, key, confirmed)
        return (said, gr.Checkbox(value=False), *listing(key))   # the choice stays unless it was deleted

    def fetch(repo_id, file, folder):
        yield from download(ctx, repo_id, file, folder)

    refresh.click(listing, None, [table, total, choice], api_name="models", show_progress="hidden")
    if tabs_select is not None:
        tabs_select(listing, None, [table, total, choice], api_visibility="private", show_progress="hidden")
    download_btn.click(fetch, [repo, path, into], progress, api_name="download_model",
                       concurrency_id="model-download", concurrency_limit=1).then(listing, None, [table, total, choice])
    delete_btn.click(delete, [choice, confirm], [deleted, confirm, table, total, choice], api_name="delete_model",
                     concurrency_id="model-delete", concurrency_limit=1)
