"""The listener's hooks: message handlers, periodic tasks and companions, by name.

Kept apart from :mod:`approvals.listener` (which re-exports them) so parts of
the app can register before any listener exists.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class _Periodic:
    interval: Callable[[], float | None]
    task: Callable[[], Any]
    judges_leases: bool = False


_handlers: dict[str, Callable[[dict], None]] = {}
_periodic: dict[str, _Periodic] = {}
_starters: dict[str, Callable[[Any], Any]] = {}


def on_message(kind: str, handler: Callable[[dict], None]) -> None:
    """Call ``handler(event)`` for events of type ``kind`` that come from other processes.

    Such events are not delivered to waiters or sockets. Registering a kind
    again replaces its handler.
    """
    _handlers[kind] = handler


def every(
    name: str,
    interval: Callable[[], float | None],
    task: Callable[[], Any],
    *,
    judges_leases: bool = False,
) -> None:
    """Run ``task()`` in the re-check thread every ``interval()`` seconds (``None``: never).

    With ``judges_leases`` (a task that decides from process leases whether
    calls were abandoned), this process's lease is renewed first, so the task
    never judges this process dead. Other tasks leave the lease to its own
    ``HEARTBEAT_INTERVAL``: a lease written to the database wakes every other
    process's SQLite watcher. Registering a name again replaces it.
    """
    _periodic[name] = _Periodic(interval, task, judges_leases)


def on_start(name: str, start: Callable[[Any], Any]) -> None:
    """Call ``start(listener)`` when a listener starts, for work that runs beside it.

    What it returns, if it has a ``stop(timeout)`` method, is stopped with the
    listener. Registering a name again replaces it.
    """
    _starters[name] = start
