"""The sweep: record the outcome of calls nobody will answer any more.

A pending call past its deadline becomes ``expired``; one whose waiting process
stopped beating becomes ``abandoned``. Each process's listener runs
:func:`sweep` every ``SWEEP_INTERVAL`` seconds (registered in
``AppConfig.ready``); ``manage.py approvals_sweep`` runs it once.
"""

from __future__ import annotations

from datetime import timedelta

from django.db.models import Q
from django.utils import timezone

from .conf import setting
from .decisions import decide
from .models import Approval, ProcessLease, Status, Via


def expire_overdue(limit: int = 1000) -> int:
    """Record ``expired`` (via ``sweep``) for pending calls past their deadline."""
    now = timezone.now()
    ids = list(
        Approval.objects.filter(status=Status.PENDING, expires_at__lte=now)
        .order_by("expires_at")
        .values_list("approval_id", flat=True)[:limit]
    )
    return sum(decide(aid, Status.EXPIRED, via=Via.SWEEP).won for aid in ids)


def abandon_orphans(lease_timeout: float, limit: int = 1000) -> int:
    """Record ``abandoned`` (via ``sweep``) for pending calls whose waiting process is gone."""
    cutoff = timezone.now() - timedelta(seconds=lease_timeout)
    alive = ProcessLease.objects.filter(heartbeat_at__gt=cutoff).values("key")
    # A call younger than the lease timeout is never judged: its process may
    # simply not have beaten yet (or be re-writing a lease that went missing).
    ids = list(
        Approval.objects.filter(status=Status.PENDING, created_at__lt=cutoff)
        .exclude(waiter="")
        .exclude(waiter__in=alive)
        .order_by("created_at")
        .values_list("approval_id", flat=True)[:limit]
    )
    won = sum(decide(aid, Status.ABANDONED, via=Via.SWEEP).won for aid in ids)
    ProcessLease.objects.filter(heartbeat_at__lte=cutoff - timedelta(hours=1)).delete()
    return won


def abandon_silent_agents(agent_lease_timeout: float, limit: int = 1000) -> int:
    """Record ``abandoned`` (via ``sweep``) for HTTP agents' calls nobody asks about.

    A call gated with an agent key is alive while its agent asks about it.
    ``agent_seen_at`` is the last sighting, and while a long-poll is open it is
    dated to that wait's end, so a call some process is holding a wait for is
    never judged, whichever process holds it (and one whose process died counts
    from when its wait would have ended).
    """
    cutoff = timezone.now() - timedelta(seconds=agent_lease_timeout)
    silent = Q(agent_seen_at__lt=cutoff) | Q(agent_seen_at__isnull=True, created_at__lt=cutoff)
    ids = list(
        Approval.objects.filter(status=Status.PENDING, agent_key__isnull=False, waiter="")
        .filter(silent)
        .order_by("agent_seen_at")
        .values_list("approval_id", flat=True)[:limit]
    )
    return sum(decide(aid, Status.ABANDONED, via=Via.SWEEP).won for aid in ids)


def sweep(lease_timeout: float | None = None) -> tuple[int, int]:
    """One pass: ``(expired, abandoned)``."""
    lease = setting("LEASE_TIMEOUT") if lease_timeout is None else lease_timeout
    agents = abandon_silent_agents(setting("AGENT_LEASE_TIMEOUT"))
    return expire_overdue(), abandon_orphans(lease) + agents
