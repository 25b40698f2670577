"""Gating one call, behind :mod:`approvals.gate`: check it, write its row, finish its wait.

The order that makes the gate race-free lives here: the waiter's slot is
registered before the row is written, and the row is announced only after it
commits, so a decision arriving at any moment after is never lost.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta
from typing import Any

from asgiref.sync import sync_to_async
from django.db import IntegrityError, connections
from django.utils import timezone

from . import announce, argschema, hooks, knownrows, rules
from .aftercommit import atomic_then
from .conf import setting
from .decisions import decide
from .listener import Listener
from .models import Approval, Status, Via, status_for_answer
from .waiting import INTERRUPTED, Slot

logger = logging.getLogger("approvals")


def gate_call(
    listener: Listener, details: dict[str, Any], seconds: float, owner: str | None = None
) -> Slot:
    """Register a slot, write the row (already decided when a rule answers), announce it.

    An ``approval_id`` already written resumes that call instead (see :func:`resume`).
    ``owner`` (the user's username, when known) goes out with ``tool_start``.
    """
    rule = rules.match(
        details["user_id"], details["session_id"], details["tool_name"], details["arguments"]
    )
    now = timezone.now()
    expires_at = now + timedelta(seconds=seconds)
    slot = listener.register(Slot(details["approval_id"], expires_at))
    fields = {**details, "created_at": now, "expires_at": expires_at, "waiter": listener.key}
    if rule is not None:
        fields.update(
            status=status_for_answer(rule.decision),
            decided_via=Via.RULE,
            reason=rules.describe(rule),
            decided_at=now,
            waiter="",
        )
    try:
        with atomic_then([]) as after:
            approval = Approval.objects.create(**fields)
            approval.owner = owner
            hooks.gated(approval)
            after.append(lambda: announce.call_gated(approval))
        knownrows.remember(approval)
    except IntegrityError:
        return resume(listener, slot, details["session_id"], details["approval_id"])
    except BaseException:
        listener.unregister(slot)
        raise
    if rule is not None:
        slot.set(approval.status)
        listener.unregister(slot)  # answered: nothing to wait for, even if wait is skipped
    return slot


def resume(listener: Listener, slot: Slot, session_id: str, approval_id: str) -> Slot:
    """Wait again for a call already written: its outcome if decided, else for it."""
    row = (
        Approval.objects.filter(approval_id=approval_id)
        .values("session_id", "status", "expires_at")
        .first()
    )
    if row is None or row["session_id"] != session_id:
        listener.unregister(slot)
        raise ValueError(f"approval_id {approval_id!r} is already used by another session")
    slot.expires_at = row["expires_at"]
    if row["status"] != Status.PENDING:
        slot.set(row["status"])
    else:
        Approval.objects.filter(approval_id=approval_id, status=Status.PENDING).update(
            waiter=listener.key
        )
        fresh = Approval.objects.filter(approval_id=approval_id).values("status").first()
        if fresh and fresh["status"] != Status.PENDING:
            slot.set(fresh["status"])
    return slot


def finish(slot: Slot, approval_id: str, outcome: str | None) -> str:
    """Turn what woke the waiter into the call's final status, recording it if ours."""
    if outcome is not None and outcome != INTERRUPTED:
        return outcome
    status = Status.CANCELLED if outcome == INTERRUPTED else Status.EXPIRED
    via = Via.CANCEL if outcome == INTERRUPTED else Via.TIMEOUT
    result = decide(approval_id, status, via=via)
    return result.status or status


def remaining(slot: Slot, timeout: float | None) -> float:
    left = float("inf")
    if slot.expires_at is not None:
        left = (slot.expires_at - timezone.now()).total_seconds()
    if timeout is not None:
        left = min(left, float(timeout))
    return max(0.0, left)


def decision_timeout(timeout: float | None) -> float:
    value = setting("DECISION_TIMEOUT") if timeout is None else timeout
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, not {value!r}")
    return float(value)


def check_details(session_id, approval_id, tool_name, tool_call_id, arguments) -> None:
    for name, value in (
        ("session_id", session_id),
        ("approval_id", approval_id),
        ("tool_name", tool_name),
        ("tool_call_id", tool_call_id),
    ):
        limit = Approval.limit(name)
        if not isinstance(value, str):
            raise ValueError(f"{name} must be a string, not {type(value).__name__}")
        if len(value) > limit:
            raise ValueError(f"{name} is longer than {limit} characters")
    if not approval_id:
        raise ValueError("approval_id must not be empty")
    if arguments is not None:
        check_arguments(arguments)


def check_arguments(arguments: Any) -> None:
    """Refuse arguments that are not JSON, over ``MAX_ARGUMENTS_BYTES``, or not storable text."""
    try:
        text = json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"arguments must be JSON-serialisable: {exc}") from None
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise ValueError("arguments contain a lone surrogate, which is not valid text") from None
    limit = setting("MAX_ARGUMENTS_BYTES")
    if size > limit:
        raise ValueError(
            f"arguments are {size} bytes of JSON; the limit is {limit} "
            '(APPROVALS["MAX_ARGUMENTS_BYTES"])'
        )
    if _has_nul(arguments):
        raise ValueError("arguments contain a NUL character, which databases do not store")


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return any(_has_nul(v) for v in value)
    return False


#: The longest ``description`` a gated call may carry.
MAX_DESCRIPTION_LENGTH = 2000
#: The largest ``arguments_schema``, in bytes of compact (ASCII) JSON.
MAX_SCHEMA_BYTES = 64 * 1024


def check_context(description: Any, editable: Any, arguments_schema: Any) -> None:
    if not isinstance(description, str):
        raise ValueError(f"description must be a string, not {type(description).__name__}")
    if len(description) > MAX_DESCRIPTION_LENGTH:
        raise ValueError(f"description is longer than {MAX_DESCRIPTION_LENGTH} characters")
    if not isinstance(editable, bool):
        raise ValueError(f"editable must be True or False, not {editable!r}")
    if arguments_schema is not None:
        if not isinstance(arguments_schema, dict):
            raise ValueError("arguments_schema must be a JSON Schema object (a dict) or None")
        try:
            size = len(json.dumps(arguments_schema, separators=(",", ":")))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"arguments_schema must be JSON-serialisable: {exc}") from None
        if size > MAX_SCHEMA_BYTES:  # it travels whole in every socket event of the call
            raise ValueError(f"arguments_schema is over {MAX_SCHEMA_BYTES} bytes of JSON")
        argschema.check_schema(arguments_schema)


def with_db_cleanup(fn):
    def run() -> None:
        try:
            fn()
        finally:
            connections.close_all()

    return run


#: Database calls of async waiters (begin, finish) in flight at once per event
#: loop; the others wait their turn on a semaphore, which costs a few hundred
#: bytes, rather than as queued thread hops (a context copy, futures and a work
#: item each: ~4 KiB, so 10,000 at once used to add ~40 MiB at the peak).
SYNC_CALLS_IN_FLIGHT = 16
_semaphores: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
    weakref.WeakKeyDictionary()
)


async def limited_sync(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``await sync_to_async(fn)(*args, **kwargs)``, at most ``SYNC_CALLS_IN_FLIGHT`` at once.

    Still ``sync_to_async`` with its thread-sensitive default, so the call runs
    where it always did (a test case's thread and transaction included).
    """
    loop = asyncio.get_running_loop()
    semaphore = _semaphores.get(loop)
    if semaphore is None:
        semaphore = _semaphores[loop] = asyncio.Semaphore(SYNC_CALLS_IN_FLIGHT)
    async with semaphore:
        return await sync_to_async(fn)(*args, **kwargs)


_recorder: ThreadPoolExecutor | None = None
_recorder_lock = threading.Lock()


def in_background(fn: Callable[[], None]) -> Future:
    """Run ``fn`` on a small pool of threads that outlives the caller's event loop.

    For work that must finish even when the task that asked for it is cancelled
    again or its loop stops (recording ``cancelled``): the pool's threads are
    joined at interpreter exit, and 10,000 requests queue rather than start
    10,000 threads.
    """
    global _recorder
    with _recorder_lock:
        if _recorder is None:
            _recorder = ThreadPoolExecutor(4, thread_name_prefix="toolgate-record")
        return _recorder.submit(with_db_cleanup(_logged(fn)))


def _logged(fn: Callable[[], Any]) -> Callable[[], None]:
    def run() -> None:
        try:
            fn()
        except Exception:
            logger.exception("approvals: recording in the background failed")

    return run
