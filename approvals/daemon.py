"""A daemon thread that runs its work again after a failure, until it is stopped.

The database watchers (:mod:`approvals.dbwatch`) and the WAL checkpoints
(:mod:`approvals.walcheck`) run as such threads: ``run()`` returns to be run
again (a file replaced, a connection lost) or raises (logged as a warning),
and the next run waits 0.1 s, doubling up to 5 s while runs keep ending soon.
:func:`drop_connection` is how the listener's and the outbox worker's threads
clean up after a failed pass.
"""

from __future__ import annotations

import logging
import threading
import time

from django.db import close_old_connections, connection

logger = logging.getLogger("approvals.listener")

_BACKOFF_MAX = 5.0


class GuardedThread:
    """Runs :meth:`run` in a daemon thread named ``name`` until :meth:`stop`."""

    name = "toolgate-thread"
    #: What the warning logged when ``run()`` raises says failed.
    failure = "thread failed"

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._guarded, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._interrupt()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _interrupt(self) -> None:
        """End any wait ``run()`` is in (after the stop flag is set)."""

    def _guarded(self) -> None:
        backoff = 0.1
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.run()
            except Exception as exc:
                logger.warning("approvals: %s: %s", self.failure, exc)
            if time.monotonic() - started > 30:
                backoff = 0.1
            self._stop.wait(backoff)
            backoff = min(backoff * 2, _BACKOFF_MAX)

    def run(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError


def drop_connection() -> None:
    """Close this thread's connection after a failed pass, whatever state it is in.

    Each step on its own: ``close_old_connections`` may itself fail on a
    connection in a bad state, and the close must still happen, or a
    transaction left open (holding SQLite's write lock) would outlive the pass.
    """
    try:
        close_old_connections()
    except Exception:
        pass
    try:
        connection.close()
    except Exception:
        pass
