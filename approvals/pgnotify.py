"""Deliver straight from a PostgreSQL notification's payload, without a re-check pass.

The trigger of migration 0006 notifies ``approval_id:status`` once the writing
transaction commits. A final status for a call waiting in this process wakes
its waiter at once, with no query; sockets here get the full event from one
read of that row (by its unique approval id). The listener dedupes, so the
table tail behind this (the safety net) never delivers the same event twice.
"""

from __future__ import annotations

from typing import Any

from django.db import close_old_connections, connection

from .dbtail import decision_event, start_event

PENDING = "pending"


def parse(payload: str) -> tuple[str, str]:
    """``(approval_id, status)``; the status is ``""`` for a payload without one
    (the trigger of migration 0005 sent the id alone)."""
    approval_id, sep, status = payload.rpartition(":")
    return (approval_id, status) if sep else (payload, "")


def handle(listener: Any, payload: str) -> None:
    """Wake a local waiter from the payload; read the row only for local sockets.

    ``listener`` is the process's :class:`~approvals.listener.Listener`.
    """
    approval_id, status = parse(payload)
    wanted = listener.settle(approval_id, status)
    if not wanted:
        return
    try:
        event = start_event(approval_id) if wanted == "start" else decision_event(approval_id)
        if event is None and wanted == "unknown":
            event = start_event(approval_id)
    except Exception:
        # A connection gone bad: drop it, and let the re-check read the row.
        close_old_connections()
        connection.close()
        raise
    if event is not None:
        listener.deliver(event)
