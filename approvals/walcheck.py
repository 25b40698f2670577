"""SQLite WAL checkpoints in a thread beside the listener, not in the commit that fills the WAL.

In WAL mode each commit appends the pages it changed to the ``-wal`` file. By
default the commit that brings the file to ``wal_autocheckpoint`` pages (1,000)
then copies them all back into the database, and syncs both files, before it
returns. A call gated and decided writes about 25 pages (the approvals table
has fourteen indexes), so one decision in a few dozen waited for that copy,
and so did the agent it wakes: milliseconds, most of a wake's p99
(BENCHMARKS.md).

One thread per process, started with the listener, copies the WAL back with
``PRAGMA wal_checkpoint(PASSIVE)`` on a connection of its own soon after
commits, so the WAL seldom reaches the threshold and commits seldom copy it
themselves. A passive checkpoint waits for nobody: writers go on appending
meanwhile, readers keep their snapshots, and when another checkpoint is under
way (another process's thread, a commit's own) it returns at once. It copies
what SQLite's own checkpoint would have copied, no more, and
``wal_autocheckpoint`` is left as it is: the safety net, and what a process
without a listener (a management command) does as before.

On Linux the thread sleeps on inotify until the ``-wal`` file (or the database
file) is written; elsewhere it looks every ``FAST`` seconds while commits come,
backing off to ``SLOW``. It copies only when ``PRAGMA data_version`` says
another connection committed since its last look (a checkpoint's own write to
the database file wakes it, and is not a commit), and spaces its checkpoints
so that each copies about ``TARGET_FRAMES`` (every ``FAST`` to ``SLOW``
seconds, or ``QUIET_GAP`` while commits are few and small): each one syncs
the WAL and the database file, and writes the database file, which wakes every
process's watcher.

It reads the database only through SQLite. Opening and closing the database's
files (the ``-shm`` above all) with a descriptor of its own would drop the
POSIX locks SQLite holds on them for the whole process, and another process
could then copy back, or start the WAL over, under this process's readers:
a corrupt database.

On a database not in WAL mode the checkpoint does nothing.
``APPROVALS["SQLITE_CHECKPOINTS"] = False`` leaves checkpoints to SQLite alone,
for a tool that manages the WAL itself.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections

from . import inotify
from .conf import setting
from .daemon import GuardedThread
from .dbwatch import data_version, file_identity, sqlite_path

#: The shortest time between looks.
FAST = 0.02
#: Frames a checkpoint aims to copy back (the WAL is copied by the commit that
#: reaches 1,000, ``wal_autocheckpoint``'s default).
TARGET_FRAMES = 250
#: Without inotify: the longest time between looks, once the WAL stops growing.
SLOW = 1.0
#: With inotify: the longest sleep on the file events.
FALLBACK = 30.0
#: Seconds between checkpoints while the WAL grows by a few frames at a time.
QUIET_GAP = 30.0


class Checkpointer(GuardedThread):
    """A daemon thread copying one SQLite database's WAL back into it (passive checkpoints).

    ``path()`` names the file; at every look a renamed, replaced or other file
    is opened afresh (with inotify, a file replaced wakes the thread; another
    name set meanwhile is seen at the next look, within ``FALLBACK``). ``looks``
    counts how often it looked, ``runs`` the checkpoints it ran,
    and ``last`` is the last one's ``(busy, frames in the WAL, frames of them
    in the database)``.
    """

    name = "toolgate-checkpoint"
    failure = "WAL checkpoints failed"

    def __init__(self, path: Callable[[], str]) -> None:
        super().__init__()
        self.path = path
        self.looks = 0
        self.runs = 0
        self.last: tuple[int, int, int] | None = None
        #: Seconds to wait after a checkpoint before the next (see :func:`_spacing`).
        self.spacing = FAST
        self.mode = ""  # "inotify" or "poll", once the file is open
        self._files: inotify.DirWatch | None = None

    def _interrupt(self) -> None:
        files = self._files
        if files is not None:
            files.interrupt()

    def run(self) -> None:
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
            self._loop(conn, path, ident)
        finally:
            self._files = None
            if files is not None:
                files.close()
            conn.close()

    def _loop(self, conn: sqlite3.Connection, path: str, ident: tuple) -> None:
        delay, seen = FAST, None
        # (Re)opened: what was written meanwhile is unknown, so look at once.
        while self.path() == path and file_identity(path) == ident:
            self.looks += 1
            version = data_version(conn)
            left = self.last is not None and self.last[1] != self.last[2]
            if version != seen or left:
                # Committed to since the last look, or frames left behind (a reader
                # was still on them): copy back.
                seen = version
                before, self.last = self.last, self.checkpoint(conn)
                copied = _copied(before, self.last)
                self.spacing = _spacing(self.spacing, copied)
                delay = _pause(self.spacing, copied)
            else:  # woken by a checkpoint's write, or polling a quiet database
                delay = min(delay * 2, SLOW)
            if self._stop.wait(max(delay, FAST)):
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


def _copied(before: tuple[int, int, int] | None, after: tuple[int, int, int]) -> int:
    """Frames the checkpoint ``after`` copied back, ``before`` being the one before it."""
    if after[2] < 0:
        return 0  # busy, or no WAL
    if before is None or before[2] < 0 or after[1] < before[1]:
        return after[2]  # the WAL started over in between
    return max(after[2] - before[2], 0)


def _spacing(spacing: float, copied: int) -> float:
    """The wait after a checkpoint that copied ``copied`` frames: aiming at
    ``TARGET_FRAMES`` per checkpoint, at most halved or doubled each time,
    between ``FAST`` and ``SLOW``. Each checkpoint syncs the WAL and the
    database file, so a busy database gets a few large ones, not one per commit."""
    wanted = spacing * TARGET_FRAMES / max(copied, 1)
    return min(max(wanted, spacing / 2, FAST), spacing * 2, SLOW)


def _pause(spacing: float, copied: int) -> float:
    """The wait after a checkpoint: its spacing, or ``QUIET_GAP`` once commits are
    few and small (a heartbeat every few seconds): the commit that would reach
    1,000 frames is far off, and each checkpoint writes the database file, which
    wakes every process's watcher."""
    if spacing >= SLOW and copied < TARGET_FRAMES // 10:
        return QUIET_GAP
    return spacing


def start(listener: Any = None, alias: str = DEFAULT_DB_ALIAS) -> Checkpointer | None:
    """Start the checkpoints of ``alias`` (the listener's ``on_start`` hook).

    ``None`` when the setting is off or the database is not an SQLite file.
    """
    if not setting("SQLITE_CHECKPOINTS") or sqlite_path(alias) is None:
        return None
    checkpointer = Checkpointer(lambda: str(connections[alias].settings_dict["NAME"]))
    checkpointer.start()
    return checkpointer
