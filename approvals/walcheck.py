"""SQLite WAL checkpoints in a thread beside the listener, not in the commit that fills the WAL.

In WAL mode each commit appends the pages it changed to the ``-wal`` file. By
default the commit that brings the file to ``wal_autocheckpoint`` pages (1,000)
then copies them all back into the database, and syncs both files, before it
returns. A call gated and decided writes about 25 pages (the approvals table
has fourteen indexes), so one decision in a few dozen waited for that copy,
and so did the agent it wakes: milliseconds, most of a wake's p99
(BENCHMARKS.md).

One thread per process, started with the listener, copies the WAL back with
``PRAGMA wal_checkpoint(PASSIVE)`` on a connection of its own once it holds
``MIN_FRAMES`` pages not yet in the database, well before the threshold, so
commits seldom do it themselves. A passive checkpoint waits for nobody:
writers go on appending meanwhile, readers keep their snapshots, and when
another checkpoint is under way (another process's thread, a commit's own) it
returns at once. It copies what SQLite's own checkpoint would have copied, no
more, and ``wal_autocheckpoint`` is left as it is: the safety net, and what a
process without a listener (a management command) does as before.

How far the WAL is ahead of the database is read from the wal-index (the
``-shm`` file every connection to the database maps; its header holds the last
frame and the last frame copied back, in a layout SQLite keeps for every
version that may share the file), so a look costs one small read, no
statement. On Linux the thread sleeps on inotify until the ``-wal`` file (or
the database file) is written; elsewhere it looks every ``FAST`` seconds
while the WAL grows, backing off to ``SLOW``. Either way it looks at most
every ``FAST`` seconds, and a WAL with a few pages in it (a heartbeat) is
left alone: copying it would write the database file, which wakes every
process's watcher.

On a database not in WAL mode there is no wal-index and nothing to copy.
``APPROVALS["SQLITE_CHECKPOINTS"] = False`` leaves checkpoints to SQLite alone,
for a tool that manages the WAL itself.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections

from . import inotify
from .conf import setting
from .dbwatch import file_identity, sqlite_path

logger = logging.getLogger("approvals.listener")

#: Pages in the WAL, not yet in the database, that are worth copying back now.
MIN_FRAMES = 100
#: The shortest time between looks.
FAST = 0.02
#: Without inotify: the longest time between looks, once the WAL stops growing.
SLOW = 1.0
#: With inotify: the longest sleep on the file events.
FALLBACK = 30.0
_BACKOFF_MAX = 5.0
#: The wal-index header: its version (u32 at 0; two copies of 48 bytes), the
#: last valid frame (u32 at 16), and the last frame copied back (u32 at 96).
_SHM_VERSION = 3007000
_SHM_HEAD = 100


def frames_behind(path: str) -> int | None:
    """Frames in the WAL of the database at ``path`` not yet copied back into it.

    ``None`` when there is no wal-index (not in WAL mode, or no connection ever
    opened it) or it cannot be read consistently now.
    """
    try:
        fd = os.open(f"{path}-shm", os.O_RDONLY)
    except OSError:
        return None
    try:
        head = os.pread(fd, _SHM_HEAD, 0)
    finally:
        os.close(fd)
    if len(head) < _SHM_HEAD or head[:48] != head[48:96] or head[12] != 1:
        return None  # uninitialised, or caught between its two copies
    version, last = struct.unpack_from("=I12xI", head, 0)
    (copied,) = struct.unpack_from("=I", head, 96)
    if version != _SHM_VERSION:
        return None
    return max(last - copied, 0)


class Checkpointer:
    """A daemon thread copying one SQLite database's WAL back into it (passive checkpoints).

    ``path()`` names the file; at every look a renamed, replaced or other file
    is opened afresh (with inotify, a file replaced wakes the thread; another
    name set meanwhile is seen at the next look, within ``FALLBACK``). ``looks``
    counts how often it read the wal-index, ``runs`` the checkpoints it ran,
    and ``last`` is the last one's ``(busy, frames in the WAL, frames of them
    in the database)``.
    """

    name = "toolgate-checkpoint"

    def __init__(self, path: Callable[[], str]) -> None:
        self.path = path
        self.looks = 0
        self.runs = 0
        self.last: tuple[int, int, int] | None = None
        self.mode = ""  # "inotify" or "poll", once the file is open
        self._files: inotify.DirWatch | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._guarded, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        files = self._files
        if files is not None:
            files.interrupt()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _guarded(self) -> None:
        backoff = 0.1
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self._run()
            except Exception as exc:
                logger.warning("approvals: WAL checkpoints failed: %s", exc)
            if time.monotonic() - started > 30:
                backoff = 0.1
            self._stop.wait(backoff)
            backoff = min(backoff * 2, _BACKOFF_MAX)

    def _run(self) -> None:
        path = self.path()
        ident = file_identity(path)
        if ident is None:
            return  # not created yet, or removed: looked for again after a pause
        real = os.path.realpath(path)  # SQLite names its -wal and -shm after it
        # Read-write, never create: a file removed meanwhile stays removed.
        uri = f"{Path(real).as_uri()}?mode=rw"
        conn = sqlite3.connect(
            uri, uri=True, isolation_level=None, check_same_thread=False, timeout=1
        )
        name = os.path.basename(real)
        # The -wal written: a commit; the file itself replaced or renamed: open afresh.
        files = inotify.watch_directory(os.path.dirname(real), [name, name + "-wal"])
        self._files, self.mode = files, ("poll" if files is None else "inotify")
        try:
            self._loop(conn, path, real, ident)
        finally:
            self._files = None
            if files is not None:
                files.close()
            conn.close()

    def _loop(self, conn: sqlite3.Connection, path: str, real: str, ident: tuple) -> None:
        delay, before = FAST, None
        # (Re)opened: what was written meanwhile is unknown, so look at once.
        while self.path() == path and file_identity(path) == ident:
            self.looks += 1
            behind = frames_behind(real)
            if behind is not None and behind >= MIN_FRAMES:
                self.last = self.checkpoint(conn)
            # Without inotify: again soon while the WAL grows, else less and less often.
            delay = FAST if behind != before else min(delay * 2, SLOW)
            before = behind
            if self._stop.wait(FAST if self._files is not None else delay):
                return
            if self._files is not None:
                self._files.wait(FALLBACK)  # until the -wal (or the file) is written
                if self._stop.is_set() or self._files.gone:
                    return  # stopped, or the directory went: open afresh
        # Another file now named, or this one replaced: the caller opens it.

    def checkpoint(self, conn: sqlite3.Connection) -> tuple[int, int, int]:
        """One passive checkpoint on ``conn``: ``(busy, frames in the WAL, frames
        of them in the database)``."""
        busy, frames, done = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        self.runs += 1
        return busy, frames, done


def start(listener: Any = None, alias: str = DEFAULT_DB_ALIAS) -> Checkpointer | None:
    """Start the checkpoints of ``alias`` (the listener's ``on_start`` hook).

    ``None`` when the setting is off or the database is not an SQLite file.
    """
    if not setting("SQLITE_CHECKPOINTS") or sqlite_path(alias) is None:
        return None
    checkpointer = Checkpointer(lambda: str(connections[alias].settings_dict["NAME"]))
    checkpointer.start()
    return checkpointer
