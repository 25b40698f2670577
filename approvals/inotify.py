"""Linux inotify through ctypes: sleep until a few names in one directory change.

The SQLite watcher (:mod:`approvals.dbwatch`) parks on this instead of polling
``PRAGMA data_version`` while nothing happens. It watches the database file's
directory, not the file, so the ``-wal`` and ``-journal`` files it names are
covered however often SQLite creates, removes or recreates them.

Where inotify is missing (not Linux, ``inotify_init1`` failing, the per-user
instance or watch limit reached) :func:`watch_directory` returns ``None``,
says so once per process in the log, and the caller polls instead.

It imports nothing of the app.
"""

from __future__ import annotations

import ctypes
import logging
import math
import os
import select
import struct
import sys
import threading
import time
from collections.abc import Iterable

logger = logging.getLogger("approvals.listener")

IN_MODIFY = 0x002
IN_MOVED_FROM = 0x040
IN_MOVED_TO = 0x080
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ONLYDIR = 0x01000000

#: What writing, creating, removing or renaming a watched name does (and the
#: directory itself going away). Not IN_ACCESS/IN_OPEN/IN_CLOSE_*: reading and
#: closing change nothing, and every connection does them.
MASK = (
    IN_MODIFY
    | IN_CREATE
    | IN_DELETE
    | IN_MOVED_FROM
    | IN_MOVED_TO
    | IN_DELETE_SELF
    | IN_MOVE_SELF
    | IN_ONLYDIR
)
_GONE = IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED
#: ``struct inotify_event``: int wd; uint32 mask, cookie, len; then char name[len].
_EVENT = struct.Struct("iIII")
_READ_SIZE = 64 * 1024
_BROKEN = select.POLLERR | select.POLLHUP | select.POLLNVAL

_told = False


def _unavailable(reason: str, level: int = logging.INFO) -> None:
    global _told
    if not _told:
        _told = True
        logger.log(level, "approvals: no inotify (%s); the SQLite watcher polls", reason)


def _libc():
    """The C library's inotify calls, or ``None`` (said once) where there are none."""
    if not sys.platform.startswith("linux"):
        _unavailable(f"not Linux: {sys.platform}", logging.DEBUG)
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)  # the process's own libc
        init, add = libc.inotify_init1, libc.inotify_add_watch
    except (OSError, AttributeError) as exc:
        _unavailable(f"libc: {exc}")
        return None
    init.argtypes, init.restype = [ctypes.c_int], ctypes.c_int
    add.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    add.restype = ctypes.c_int
    return libc


def watch_directory(directory: str, names: Iterable[str]) -> DirWatch | None:
    """A :class:`DirWatch` of ``names`` in ``directory``, or ``None`` without inotify."""
    libc = _libc()
    if libc is None:
        return None
    # IN_NONBLOCK and IN_CLOEXEC are O_NONBLOCK and O_CLOEXEC on every architecture.
    fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    if fd < 0:
        _unavailable(f"inotify_init1: {os.strerror(ctypes.get_errno())}")
        return None
    try:
        if libc.inotify_add_watch(fd, os.fsencode(directory), MASK) < 0:
            _unavailable(f"inotify_add_watch {directory}: {os.strerror(ctypes.get_errno())}")
            os.close(fd)
            return None
        return DirWatch(fd, names)
    except OSError as exc:  # no descriptor left for the wake-up pipe
        _unavailable(str(exc))
        os.close(fd)
        return None


class DirWatch:
    """One inotify instance on one directory; :meth:`wait` says whether a name changed.

    :meth:`interrupt` (any thread) ends a wait at once; :meth:`close` releases
    the descriptors, after which interrupting does nothing.
    """

    def __init__(self, fd: int, names: Iterable[str]) -> None:
        self._fd = fd
        self._names = {os.fsencode(name) for name in names}
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._poll = select.poll()
        self._poll.register(fd, select.POLLIN)
        self._poll.register(self._wake_r, select.POLLIN)
        self._wake_poll = select.poll()
        self._wake_poll.register(self._wake_r, select.POLLIN)
        #: How many times a wait woke up (tests count them).
        self.looks = 0
        self._lock = threading.Lock()
        self._closed = False
        #: The directory itself was removed or renamed: this watch sees no more.
        self.gone = False

    def wait(self, timeout: float, pause: float = 0.0) -> bool:
        """Block up to ``timeout`` seconds; True if a watched name changed (or events
        were dropped, so one may have), False on timeout or :meth:`interrupt`.

        Events for other names in the directory (a database in ``/tmp``) are read
        and dropped, and the wait goes on, first letting more gather for
        ``pause`` seconds: a busy neighbour costs one wake-up per ``pause`` at
        most, and delays a watched name's event by as much.
        """
        deadline = time.monotonic() + timeout
        while True:
            remaining = max(deadline - time.monotonic(), 0.0)
            ready = self._poll.poll(math.ceil(remaining * 1000))
            self.looks += 1
            if any(flags & _BROKEN for _, flags in ready):
                self.gone = True  # an error on a descriptor: start over, do not spin
                return True
            if any(fd == self._wake_r for fd, _ in ready):
                _drain(self._wake_r)
                return self.drain()
            if self.drain():
                return True
            if not ready or remaining <= 0:
                return False
            gap = min(pause, max(deadline - time.monotonic(), 0.0))
            if gap > 0 and self._interrupted(gap):
                return self.drain()

    def _interrupted(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for :meth:`interrupt` alone; True if it came."""
        if not self._wake_poll.poll(math.ceil(timeout * 1000)):
            return False
        _drain(self._wake_r)
        return True

    def drain(self) -> bool:
        """Read every queued event without waiting; True if one concerns a watched name."""
        hit = False
        while True:
            try:
                data = os.read(self._fd, _READ_SIZE)
            except BlockingIOError:
                return hit
            hit = self._parse(data) or hit

    def _parse(self, data: bytes) -> bool:
        hit, offset = False, 0
        while offset + _EVENT.size <= len(data):
            _wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
            start = offset + _EVENT.size
            name = data[start : start + length].split(b"\0", 1)[0]
            offset = start + length
            if mask & _GONE:
                self.gone = True
            if mask & (IN_Q_OVERFLOW | _GONE) or name in self._names:
                hit = True
        return hit

    def interrupt(self) -> None:
        with self._lock:
            if not self._closed:
                try:
                    os.write(self._wake_w, b"\0")
                except BlockingIOError:  # already full of wake-ups
                    pass

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                for fd in (self._fd, self._wake_r, self._wake_w):
                    os.close(fd)


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass
