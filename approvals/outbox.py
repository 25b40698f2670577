"""The notification outbox: deliveries written in the transaction of the change they report.

:func:`connect` (from ``AppConfig.ready()``) hooks :func:`on_gated` and
:func:`on_decided` into the decision path (:mod:`approvals.hooks`); they add
rows to ``Delivery`` inside its transaction, so a delivery exists exactly when
the change committed. The worker (:mod:`approvals.notify_worker`) sends them.
:func:`remind` writes ``approval.expiring`` once per call.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models.signals import post_delete, post_save
from django.utils import timezone

from . import hooks
from .conf import setting
from .models import Approval, Delivery, Reminder, Status, Webhook
from .notify_bodies import email_body, links, webhook_body

#: Seconds a process trusts its list of active webhooks (changes here apply at once).
WEBHOOK_CACHE_SECONDS = 1.0

_cache: dict[str, Any] = {"at": -1e9, "hooks": []}
_cache_lock = threading.Lock()
_wakers: list[Callable[[], None]] = []


def on_written(fn: Callable[[], None]) -> None:
    """Call ``fn()`` after a transaction that wrote deliveries commits (wakes the worker)."""
    if fn not in _wakers:
        _wakers.append(fn)


def active_webhooks() -> list[Webhook]:
    """The active webhooks, cached for ``WEBHOOK_CACHE_SECONDS`` (a query per gate otherwise)."""
    now = time.monotonic()
    with _cache_lock:
        if now - _cache["at"] < WEBHOOK_CACHE_SECONDS:
            return _cache["hooks"]
    found = list(Webhook.objects.filter(active=True))
    with _cache_lock:
        _cache.update(at=now, hooks=found)
    return found


def forget_webhooks(**kwargs: Any) -> None:
    with _cache_lock:
        _cache["at"] = -1e9


def _wants(hook: Webhook, event: str, approval: Approval) -> bool:
    events = hook.events if isinstance(hook.events, list) else []
    return event in events and (hook.user_id is None or hook.user_id == approval.user_id)


def write(event: str, approval: Approval, *, email: bool = False) -> int:
    """Add the deliveries ``event`` needs for ``approval`` to the current transaction."""
    rows = []
    for hook in active_webhooks():
        if _wants(hook, event, approval):
            did = uuid.uuid4()
            body = webhook_body(hook.format, event, str(did), approval)
            rows.append(
                Delivery(delivery_id=did, webhook=hook, event=event, approval=approval, body=body)
            )
    address = _email_for(approval) if email and setting("EMAIL_NOTIFICATIONS") else ""
    if address:
        rows.append(
            Delivery(
                email_to=address, event=event, approval=approval, body=email_body(event, approval)
            )
        )
    if rows:
        Delivery.objects.bulk_create(rows)
        for fn in _wakers:
            transaction.on_commit(fn, robust=True)
    return len(rows)


def _email_for(approval: Approval) -> str:
    if approval.user_id is None:
        return ""
    user = approval.user
    field = getattr(user, "EMAIL_FIELD", "email")
    return getattr(user, field, "") or ""


def on_gated(approval: Approval) -> None:
    """A call's row is being written: ``approval.requested`` (or decided, if a rule answered)."""
    if approval.status == Status.PENDING:
        write("approval.requested", approval, email=True)
    elif _anyone_wants("approval.decided"):
        write("approval.decided", approval)


def on_decided(pk: Any, status: str) -> None:
    """A call was decided in this transaction: ``approval.decided``."""
    if _anyone_wants("approval.decided"):
        write("approval.decided", Approval.objects.get(pk=pk))


def _anyone_wants(event: str) -> bool:
    return any(event in (h.events or []) for h in active_webhooks())


def remind(limit: int = 200) -> int:
    """Write ``approval.expiring`` for pending calls past ``EXPIRING_AFTER`` of their time.

    Once per call, even with many processes: the ``Reminder`` row (unique per
    call) is written in the same transaction as the deliveries.
    """
    fraction = setting("EXPIRING_AFTER")
    if fraction is None or not (0 < float(fraction) < 1):
        return 0
    if not setting("EMAIL_NOTIFICATIONS") and not _anyone_wants("approval.expiring"):
        return 0  # nobody to remind: no read of the pending calls every pass
    now = timezone.now()
    candidates = Approval.objects.filter(
        status=Status.PENDING, expires_at__gt=now, reminder__isnull=True
    ).order_by("expires_at")[: limit * 4]
    fired = 0
    # Three columns per candidate; the full row only for a reminder that is due.
    for pk, created_at, expires_at in candidates.values_list("pk", "created_at", "expires_at"):
        if created_at + (expires_at - created_at) * float(fraction) > now:
            continue
        try:
            with transaction.atomic():
                approval = Approval.objects.get(pk=pk)
                Reminder.objects.create(approval=approval)
                write("approval.expiring", approval, email=True)
            fired += 1
        except (IntegrityError, Approval.DoesNotExist):  # fired elsewhere first, or gone
            continue
        if fired >= limit:
            break
    return fired


def test_delivery(hook: Webhook) -> Delivery:
    """Write a ``ping`` delivery to ``hook`` (the admin's "send test" action)."""
    did = uuid.uuid4()
    inbox = links("-")["inbox"]
    if hook.format == "slack":
        text = "toolgate test message: this webhook works."
        body = {
            "text": text,
            "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": text}}],
        }
    else:
        body = {"event": "ping", "delivery": str(did), "approval": None, "links": {"inbox": inbox}}
    with transaction.atomic():
        row = Delivery.objects.create(
            delivery_id=did, webhook=hook, event="ping", body=json.dumps(body)
        )
        for fn in _wakers:
            transaction.on_commit(fn, robust=True)
    return row


def retry(queryset) -> int:
    """Send these deliveries again as soon as possible (the admin's "retry" action).

    A delivery past ``WEBHOOK_RETRY_FOR`` gets one more attempt.
    """
    n = queryset.update(status="pending", next_attempt_at=timezone.now(), claimed_until=None)
    for fn in _wakers:
        transaction.on_commit(fn, robust=True)
    return n


def connect() -> None:
    """Hook the outbox into the decision path (called from ``AppConfig.ready()``)."""
    hooks.on_gated("outbox", on_gated)
    hooks.on_decided("outbox", on_decided, writes=lambda: _anyone_wants("approval.decided"))
    post_save.connect(forget_webhooks, sender=Webhook, dispatch_uid="approvals-webhooks")
    post_delete.connect(forget_webhooks, sender=Webhook, dispatch_uid="approvals-webhooks-del")
