"""Holding a long-poll open: a future on the event loop, woken by the process listener.

A waiting ``GET approvals/<id>?wait=N`` registers a :class:`~approvals.waiting.Slot`
with this process's listener, like any in-process waiter, and awaits its
future: no thread, no polling loop per request. A decision made in this
process sets the slot after commit; one made elsewhere arrives over the channel
layer or the listener's database re-check. Several requests waiting on the same
call in one process share one slot.
"""

from __future__ import annotations

import asyncio
import threading

from ..listener import get_listener
from ..waiting import Slot

_lock = threading.Lock()
_shared: dict[str, tuple[Slot, int]] = {}


def acquire(approval_id: str) -> Slot:
    """The slot this process waits on for ``approval_id`` (shared; call :func:`release`)."""
    listener = get_listener()
    with _lock:
        slot, count = _shared.get(approval_id, (None, 0))
        if slot is None:
            slot = listener.register(Slot(approval_id))
        _shared[approval_id] = (slot, count + 1)
    return slot


def release(slot: Slot) -> None:
    """One waiter less on ``slot``; the last one unregisters it."""
    with _lock:
        found, count = _shared.get(slot.approval_id, (None, 0))
        if found is not slot:
            return
        if count > 1:
            _shared[slot.approval_id] = (slot, count - 1)
            return
        del _shared[slot.approval_id]
    get_listener().unregister(slot)


async def until_decided(slot: Slot, seconds: float) -> bool:
    """Wait up to ``seconds`` for the slot's outcome; ``True`` if one came."""
    if seconds <= 0:
        return slot.status is not None
    fut = slot.future()
    try:
        await asyncio.wait_for(asyncio.shield(fut), seconds)
    except TimeoutError:
        pass
    finally:
        fut.cancel()  # settled or not, this request no longer listens
    return slot.status is not None


def waiting_here() -> int:
    """How many calls this process holds long-polls open for."""
    with _lock:
        return len(_shared)
