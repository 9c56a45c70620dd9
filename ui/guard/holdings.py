"""What each login holds: its page sessions and event ids, and its uploads.

A name (a session id, an event id, an upload id) belongs to the login that used it first and stays its own while
that login lives: each login keeps its own most recent SESSIONS_PER_LOGIN names, so no other login can push a
name out by making many of its own (a global table of the last N names could be filled by anyone). A login that
ends (gradio forgets its token) leaves its names free.

An upload belongs to each login that uploaded it (the same content twice has one path). A login's uploads that
no job has used may take UNUSED_UPLOAD_BYTES at most; those still unused UNUSED_UPLOAD_S after their upload are
removed from disk, and a request that names one later hears that it was removed.
"""
from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

# Page loads and API clients of one login that it can still use: one is a browser tab or a client; a person
# who reloads the page a thousand times loses only the oldest of its own.
SESSIONS_PER_LOGIN = 1000
# Uploads waiting for a job: ten of the largest (50 MB) images, far more than anyone queues.
UNUSED_UPLOAD_BYTES = 500_000_000
UNUSED_UPLOAD_S = 3600.0
# Removed uploads remembered per login, to say so when one is named again.
REMOVED_REMEMBERED = 200


@dataclass
class Upload:
    size: int
    at: float
    owners: set = field(default_factory=set)
    used: bool = False


@dataclass
class Holdings:
    """Every login's names and uploads. ``live(token)`` says whether a login still lives (gradio's tokens);
    ``folder`` is where uploads are kept: nothing outside it is ever removed."""
    folder: Path | None = None
    sessions_per_login: int = SESSIONS_PER_LOGIN
    unused_bytes: int = UNUSED_UPLOAD_BYTES
    unused_s: float = UNUSED_UPLOAD_S
    clock: Callable[[], float] = time.monotonic
    _names: dict = field(default_factory=dict)          # name -> login
    _by_login: dict = field(default_factory=dict)       # login -> OrderedDict of its names
    _uploads: dict = field(default_factory=dict)        # file key -> Upload
    _removed: dict = field(default_factory=dict)        # login -> OrderedDict of file keys removed
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # ----- names -----
    def claim(self, name: str, login, live: Callable = lambda login: True) -> bool:
        """False when ``name`` belongs to another living login; else it is (now) ``login``'s."""
        with self._lock:
            owner = self._names.get(name, login)
            if owner != login:
                if live(owner):
                    return False
                self._forget_login(owner)
            mine = self._by_login.setdefault(login, OrderedDict())
            mine[name] = None
            mine.move_to_end(name)
            self._names[name] = login
            while len(mine) > self.sessions_per_login:
                oldest, _ = mine.popitem(last=False)
                self._names.pop(oldest, None)
            return True

    def owner(self, name: str):
        with self._lock:
            return self._names.get(name)

    def _forget_login(self, login) -> None:
        for name in self._by_login.pop(login, {}):
            self._names.pop(name, None)
        for upload in self._uploads.values():     # an ended login's uploads are nobody's: no one may use them
            upload.owners.discard(login)

    # ----- uploads -----
    def room_for(self, login, size: int) -> int | None:
        """None when ``login`` may upload ``size`` more bytes; else the bytes its unused uploads take."""
        with self._lock:
            waiting = sum(u.size for u in self._uploads.values() if login in u.owners and not u.used)
            return None if waiting + size <= self.unused_bytes else waiting

    def uploaded(self, keys, login) -> None:
        with self._lock:
            for key in keys:
                upload = self._uploads.get(key)
                if upload is None:
                    try:
                        size = os.stat(key).st_size
                    except OSError:
                        continue
                    upload = self._uploads[key] = Upload(size, self.clock())
                upload.owners.add(login)
                self._removed.get(login, {}).pop(key, None)

    def others(self, keys, login) -> bool:
        """Whether any of ``keys`` is an upload of other logins only."""
        with self._lock:
            return any(key in self._uploads and login not in self._uploads[key].owners for key in keys)

    def removed(self, keys, login) -> str | None:
        """The first of ``keys`` that was ``login``'s upload and was removed unused."""
        with self._lock:
            gone = self._removed.get(login, {})
            return next((key for key in keys if key in gone), None)

    def used(self, keys) -> None:
        with self._lock:
            for key in keys:
                if key in self._uploads:
                    self._uploads[key].used = True

    def sweep(self, live: Callable = lambda login: True) -> list[str]:
        """Remove the uploads no job used within ``unused_s`` of their upload, and forget logins that ended;
        returns the removed files."""
        with self._lock:
            logins = set(self._by_login).union(*(upload.owners for upload in self._uploads.values()))
            for login in logins:
                if not live(login):
                    self._forget_login(login)
            now, removed = self.clock(), []
            for key, upload in list(self._uploads.items()):
                if not upload.used and now - upload.at > self.unused_s:
                    del self._uploads[key]
                    if self._remove_file(key):
                        removed.append(key)
                    for login in upload.owners:
                        gone = self._removed.setdefault(login, OrderedDict())
                        gone[key] = None
                        while len(gone) > REMOVED_REMEMBERED:
                            gone.popitem(last=False)
            return removed

    def _remove_file(self, key: str) -> bool:
        """Remove an upload's file and its folder when empty, only inside the uploads folder."""
        if self.folder is None:
            return False
        path, folder = Path(key), Path(os.path.realpath(self.folder))
        if folder not in path.parents or path.is_symlink():
            return False
        try:
            path.unlink()
        except OSError:
            return False
        try:
            path.parent.rmdir()     # gradio keeps each upload in a folder of its own (named by its hash)
        except OSError:
            pass
        return True
