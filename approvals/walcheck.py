"""SQLite WAL checkpoints in a thread beside the listener, not in the commit that fills the WAL.

In WAL mode each commit appends the pages it changed to the ``-wal`` file. By
default the commit that brings the file to ``wal_autocheckpoint`` pages (1,000)
then copies them all back into the database, and syncs both files, before it
returns. A call gated and decided writes about 25 pages (the approvals table
has fourteen indexes), so one decision in a few dozen waited for that copy,
and so did the agent it wakes: 2–5 ms, most of a wake's p99 (BENCHMARKS.md).

One thread per process, started with the listener, runs ``PRAGMA
wal_checkpoint(PASSIVE)`` on a connection of its own soon after commits, so the
WAL is copied back well before it reaches the threshold and commits seldom do
it themselves. A passive checkpoint waits for nobody: writers go on appending
meanwhile, readers keep their snapshots, and when another checkpoint is under
way (another process's thread, a commit's own) it returns at once. It copies
what SQLite's own checkpoint would have copied, no more, and
``wal_autocheckpoint`` is left as it is: the safety net, and what a process
without a listener (a management command) does as before.

While the WAL keeps changing the thread looks every ``FAST`` seconds; when it
does not, it backs off to one look every ``SLOW`` seconds. On a database not in
WAL mode the statement does nothing (a rollback journal has nothing to copy
back). ``APPROVALS["SQLITE_CHECKPOINTS"] = False`` leaves checkpoints to
SQLite alone, for a tool that manages the WAL itself.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections

from .conf import setting
from .dbwatch import file_identity, sqlite_path

logger = logging.getLogger("approvals.listener")

#: Seconds between looks while the WAL keeps changing.
FAST = 0.02
#: The longest pause between looks, once nothing changes.
SLOW = 1.0
#: Seconds between checks that the database file is still the one opened.
STAT_EVERY = 1.0
_BACKOFF_MAX = 5.0


class Checkpointer:
    """A daemon thread running passive WAL checkpoints of one SQLite database file.

    ``path()`` names the file; it is looked at again every ``STAT_EVERY``
    seconds, and a renamed, replaced or other file is opened afresh. ``runs``
    counts the checkpoints run, and ``last`` is the last one's ``(busy, frames
    in the WAL, frames of them in the database)`` (``-1`` frames: the database
    is not in WAL mode).
    """

    name = "toolgate-checkpoint"

    def __init__(self, path: Callable[[], str]) -> None:
        self.path = path
        self.runs = 0
        self.last: tuple[int, int, int] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._guarded, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
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
        if file_identity(path) is None:
            return  # not created yet, or removed: looked for again after a pause
        # Read-write, never create: a file removed meanwhile stays removed.
        uri = f"{Path(path).resolve().as_uri()}?mode=rw"
        conn = sqlite3.connect(
            uri, uri=True, isolation_level=None, check_same_thread=False, timeout=1
        )
        try:
            self._loop(conn, path, file_identity(path))
        finally:
            conn.close()

    def _loop(self, conn: sqlite3.Connection, path: str, ident: tuple | None) -> None:
        delay = FAST
        next_stat = time.monotonic() + STAT_EVERY
        while not self._stop.wait(delay):
            now = time.monotonic()
            if now >= next_stat:
                next_stat = now + STAT_EVERY
                if self.path() != path or file_identity(path) != ident:
                    return  # the caller opens the file now named
            before = self.last
            self.last = found = self.checkpoint(conn)
            # Written to since the last look: look again soon; else less and less often.
            changed = found[1] > 0 and found != before
            delay = FAST if changed else min(delay * 2, SLOW)

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
