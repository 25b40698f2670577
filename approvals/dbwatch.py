"""Database watchers: learn within milliseconds that another process committed.

Without a cross-process channel layer the listener's table tail is the
transport, read once per ``RECHECK_INTERVAL``. A watcher lets the database
itself say when to read it, so a decision or a new call crosses processes in
milliseconds; the tail stays the safety net, and what the tail reads is still
what is delivered (the database is the truth, and delivery dedupes).

* SQLite: ``PRAGMA data_version`` changes for a connection when another
  connection commits, and reading it costs microseconds. One thread per
  process reads it on a dedicated connection and kicks the re-check when it
  moved. On Linux the thread sleeps on inotify (:mod:`approvals.inotify`) for
  the database's directory until ``<db>``, ``<db>-wal`` or ``<db>-journal`` is
  written, created, removed or renamed (other files there wake it at most
  every ``SLOW_POLL``), or ``FALLBACK`` seconds pass. A WAL commit writes the
  ``-wal`` file (an event) and then the wal-index in the mmapped ``-shm`` (no
  event), so ``data_version`` may move just after the event: after an event
  the thread reads it at once, again 1 ms later, backing off to 30 ms, and
  goes on until ``BURST`` seconds passed with no event and no change, or
  ``SETTLED`` seconds after the change it was waiting for; then it sleeps on
  the events again. Where inotify is missing (macOS,
  the limits reached) it reads every 5 ms just after a change, backing off to
  30 ms when quiet. Either way it does not look at all while the process has
  no waiter and no socket.
* PostgreSQL: ``LISTEN`` on one dedicated autocommit connection per process.
  A trigger (migrations 0005, 0006) sends ``NOTIFY`` from the writing
  transaction, so it arrives only once that transaction committed; its
  payload is ``approval_id:status``, handed to ``on_payload(payload)`` (no
  re-check pass per notification). The connection reconnects on its own with
  backoff, and kicks a re-check after each reconnect, so nothing committed
  while it was away is lost.

It knows nothing of decisions, rules or HTTP: it only calls ``on_change()``
(and, on PostgreSQL, ``on_payload``).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable

from django.db import connections

from . import inotify
from .daemon import GuardedThread

logger = logging.getLogger("approvals.listener")

#: The PostgreSQL channel the trigger of migration 0005 notifies on.
PG_CHANNEL = "toolgate_approvals"

FAST_POLL = 0.005
SLOW_POLL = 0.030
#: With inotify: the first look again after an event that ``data_version`` did
#: not show yet (the wal-index is written right after the -wal, unless the
#: commit syncs between them), backing off from there.
EVENT_POLL = 0.001
#: With inotify: seconds of fast polling after the last event or change. A WAL
#: commit writes the ``-wal`` file (the event), syncs it when ``synchronous``
#: is FULL (a slow disk takes tens of milliseconds, more under load), and only
#: then updates the wal-index in the ``-shm``, which raises no event. About 30
#: reads per burst; while commits keep coming the bursts join up into the
#: polling used without inotify.
BURST = 0.5
#: With inotify: seconds of fast polling left once ``data_version`` moved. The
#: change an event announced has been seen, and the next commit brings an event
#: of its own, which wakes a thread parked on the events sooner than a poll does;
#: so an idle process's burst after a heartbeat is about ten reads, not thirty.
SETTLED = 0.1
#: With inotify: the longest sleep on the file events. Only a missed event
#: (a file system whose writes inotify does not see, such as NFS from another
#: host) waits this long, and a wake-up a second costs next to nothing; the
#: listener's re-check (``RECHECK_INTERVAL``, 1 s) is the safety net anyway.
#: Other files written in the same directory wake it at most every
#: ``SLOW_POLL``: never more often, nor later, than polling would.
FALLBACK = 1.0
IDLE_WAIT = 0.25
_STAT_EVERY = 1.0


class Watcher(GuardedThread):
    """A daemon thread that calls ``on_change()`` soon after another connection commits.

    ``active()`` says whether anybody here would care (waiters, sockets); while
    it is false the thread looks only every ``IDLE_WAIT`` seconds, and
    :meth:`wake` ends such a wait at once.
    """

    name = "toolgate-dbwatch"
    failure = "database watcher failed"

    def __init__(
        self, alias: str, on_change: Callable[[], None], active: Callable[[], bool]
    ) -> None:
        super().__init__()
        self.alias = alias
        self.on_change = on_change
        self.active = active
        self.changes = 0
        self._wake = threading.Event()

    def _interrupt(self) -> None:
        self._wake.set()

    def wake(self) -> None:
        """Someone here started caring: end an idle wait now."""
        self._wake.set()

    def _changed(self) -> None:
        self.changes += 1
        try:
            self.on_change()
        except Exception:
            logger.exception("approvals: database watcher callback failed")


class SqliteWatcher(Watcher):
    """Reads ``PRAGMA data_version`` on a connection of its own, when inotify says
    the files changed (``mode == "inotify"``) or every few milliseconds (``"poll"``)."""

    def __init__(
        self, alias: str, on_change: Callable[[], None], active: Callable[[], bool]
    ) -> None:
        super().__init__(alias, on_change, active)
        #: ``"inotify"`` or ``"poll"``, once the database is open.
        self.mode = ""
        #: File events that concerned the database (inotify only).
        self.events = 0
        #: Set while the thread sleeps on the file events.
        self.parked = threading.Event()
        self._files: inotify.DirWatch | None = None

    def _path(self) -> str:
        return str(connections[self.alias].settings_dict["NAME"])

    def _interrupt(self) -> None:
        files = self._files
        if files is not None:
            files.interrupt()
        super()._interrupt()

    def run(self) -> None:
        path = self._path()
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=1)
        real = os.path.realpath(path)  # SQLite names its -wal after the resolved path
        names = [os.path.basename(real) + suffix for suffix in ("", "-wal", "-journal")]
        # Watched before the first read: no commit falls between the two.
        self._files = files = inotify.watch_directory(os.path.dirname(real), names)
        self.mode = "poll" if files is None else "inotify"
        try:
            self._watch(conn, path, file_identity(path))
        finally:
            self._files = None
            if files is not None:
                files.close()
            conn.close()

    def _watch(self, conn: sqlite3.Connection, path: str, ident: tuple | None) -> None:
        version = data_version(conn)
        # (Re)opened: whatever happened before is unknown, so look once.
        self._changed()
        delay = FAST_POLL
        now = time.monotonic()
        busy_until, next_stat = now + BURST, now + _STAT_EVERY
        while not self._stop.is_set():
            if not self.active():
                if self._idle():
                    busy_until = time.monotonic() + BURST
                delay = FAST_POLL
            elif self._files is None or time.monotonic() < busy_until:
                self._stop.wait(delay)
                if self._files is not None and self._files.drain():
                    # More writes: poll fast again, and longer. (Left queued, they
                    # would start another burst once this one is over.)
                    delay, busy_until = EVENT_POLL, time.monotonic() + BURST
            elif self._park():
                # Look now, then poll fast a while: the -shm may lag the event.
                delay, next_stat = EVENT_POLL, 0.0
                busy_until = time.monotonic() + BURST
            now = time.monotonic()
            if now >= next_stat:
                next_stat = now + _STAT_EVERY
                # The file replaced (a test's fresh database, a restore) or the
                # database renamed: open the new one.
                if self._path() != path or file_identity(path) != ident or self._gone():
                    return
            seen = data_version(conn)
            if seen != version:
                version = seen
                delay = FAST_POLL
                busy_until = now + SETTLED
                self._changed()
            else:
                delay = min(delay * 1.25, SLOW_POLL)

    def _idle(self) -> bool:
        """Nobody here cares: wait for :meth:`wake` (or ``IDLE_WAIT``). True if the
        files changed meanwhile (their events, read and dropped here)."""
        self._wake.wait(IDLE_WAIT)
        self._wake.clear()
        return self._files is not None and self._files.drain()

    def _park(self) -> bool:
        """Sleep on the file events, at most ``FALLBACK`` seconds; True if one came."""
        files = self._files
        if files is None:
            return False
        self.parked.set()
        try:
            hit = files.wait(FALLBACK, SLOW_POLL)
        finally:
            self.parked.clear()
        if hit:
            self.events += 1
        return hit

    def _gone(self) -> bool:
        return self._files is not None and self._files.gone


def data_version(conn: sqlite3.Connection) -> int:
    """This connection's ``PRAGMA data_version``: it moves when another connection commits."""
    return conn.execute("PRAGMA data_version").fetchone()[0]


def commit_mark(alias: str) -> tuple | None:
    """Where the calling thread's connection to ``alias`` stands: ``(connection,
    PRAGMA data_version)`` on an SQLite file, ``None`` on any other database
    (PostgreSQL, memory), where there is no such number.

    Two marks are :func:`unchanged` when nothing was committed by another
    connection in between, so a read made at the first would find the same rows
    at the second. Take the mark *before* the read it stands for, so that a
    commit during the read shows at the next look; what the thread writes on
    that connection itself does not move it.
    """
    if sqlite_path(alias) is None:
        return None
    conn = connections[alias]
    conn.ensure_connection()
    raw = conn.connection
    # The connection itself, not its id: a new one must never look unchanged.
    return (raw, data_version(raw))


def unchanged(before: tuple | None, now: tuple | None) -> bool:
    """Whether two :func:`commit_mark` marks show no commit in between (never
    across connections, nor where there is no mark)."""
    return before is not None and now is not None and before[0] is now[0] and before[1] == now[1]


def sqlite_path(alias: str) -> str | None:
    """The file of the SQLite database ``alias``; ``None`` for another database
    or one in memory."""
    conn = connections[alias]
    if conn.vendor != "sqlite":
        return None
    name = str(conn.settings_dict.get("NAME") or "")
    if not name or name == ":memory:" or name.startswith("file:") or "mode=memory" in name:
        return None
    return name


def file_identity(path: str) -> tuple | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


class PostgresWatcher(Watcher):
    """``LISTEN`` on a dedicated autocommit connection; each payload goes to ``on_payload``
    (without one, each notification kicks)."""

    #: Seconds each wait for notifications lasts before the stop flag is looked at.
    WAIT = 1.0

    def __init__(
        self,
        alias: str,
        on_change: Callable[[], None],
        active: Callable[[], bool],
        on_payload: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__(alias, on_change, active)
        self.on_payload = on_payload

    def connect(self):
        import psycopg

        params = dict(connections[self.alias].get_connection_params())
        for key in ("cursor_factory", "context", "server_side_binding", "prepare_threshold"):
            params.pop(key, None)
        params.setdefault("connect_timeout", 5)
        return psycopg.connect(**params, autocommit=True)

    def run(self) -> None:
        conn = self.connect()
        try:
            conn.execute(f"LISTEN {PG_CHANNEL}")
            self.pid = conn.info.backend_pid
            # Anything committed while no connection listened is read now.
            self._changed()
            while not self._stop.is_set():
                for note in conn.notifies(timeout=self.WAIT):
                    self._notified(note.payload)
        finally:
            conn.close()

    def _notified(self, payload: str) -> None:
        if self.on_payload is None:
            self._changed()  # a kick: several close together make one pass
            return
        self.changes += 1
        try:
            self.on_payload(payload)
        except Exception:
            # The re-check reads what the payload could not deliver.
            logger.exception("approvals: database notification %r not delivered", payload)
            self.on_change()


def watcher_for(
    alias: str,
    on_change: Callable[[], None],
    active: Callable[[], bool],
    on_payload: Callable[[str], None] | None = None,
) -> Watcher | None:
    """A watcher for the database ``alias``, or ``None`` if it has no way to tell.

    ``on_payload`` receives each PostgreSQL notification's payload instead of a kick.
    """
    conn = connections[alias]
    if conn.vendor == "sqlite":
        return None if sqlite_path(alias) is None else SqliteWatcher(alias, on_change, active)
    if conn.vendor == "postgresql":
        try:
            import psycopg  # noqa: F401
        except ImportError:  # psycopg2: the re-check alone carries events
            return None
        return PostgresWatcher(alias, on_change, active, on_payload)
    return None
