"""The process listener: one per process, not one per waiter.

It holds this process's waiting slots and WebSocket subscribers and connects
them to the rest of the site:

* events made here (a call gated, a call decided) are delivered to local
  slots and sockets at once, then published on the channel layer for the other
  processes, from the listener's own event loop (never a new loop per call);
* events from other processes arrive on one channel-layer group and are
  delivered the same way;
* a re-check thread asks the database, once per interval for the whole
  process, for decisions on local slots and (when sockets are connected) for
  rows created or decided since it last looked. Without a cross-process
  channel layer this tail is the transport; with one it is the safety net that
  makes a dropped message cost latency, never a decision.

Each event reaches a local socket at most once, whichever path brings it first.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from datetime import timedelta

from django.db import close_old_connections, connection
from django.utils import timezone

from .conf import setting
from .layerlink import LayerLink, own_layer_instance
from .models import FINAL_STATUSES
from .slots import Slot

logger = logging.getLogger("approvals.listener")

Subscriber = Callable[[dict], None]
_SEEN_MAX = 50_000
_HOLE_SECONDS = 30.0
_DECIDED_OVERLAP = timedelta(seconds=10)
_START_OVERLAP = timedelta(seconds=5)
_FULL_CHECK_SECONDS = 30.0


class Listener:
    """This process's registry of slots and subscribers, and its links to other processes."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.key = f"{socket.gethostname()[:30]}-{self.pid}-{uuid.uuid4().hex[:12]}"
        self._lock = threading.RLock()
        self._slots: dict[str, Slot] = {}
        self._subscribers: set[Subscriber] = set()
        self._seen: OrderedDict[str, str] = OrderedDict()
        self._lease_written = False
        self._stop = threading.Event()
        self._kick = threading.Event()
        self._link: LayerLink | None = None
        self._group = f"{setting('GROUP_PREFIX')}.events"
        self._tail = _Tail()
        self._last_heartbeat = 0.0
        self._last_sweep = time.monotonic()
        self._last_full_check = time.monotonic()
        self._threads: list[threading.Thread] = []

    # -- lifecycle -------------------------------------------------------
    def start(self) -> None:
        layer = own_layer_instance(setting("CHANNEL_LAYER"))
        if layer is not None:
            self._link = LayerLink(layer, self._group, self._on_layer_message)
            self._link.start()
        t = threading.Thread(target=self._run_recheck, name="toolgate-recheck", daemon=True)
        t.start()
        self._threads.append(t)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the threads (tests and interpreter exit)."""
        self._stop.set()
        self._kick.set()
        if self._link is not None:
            self._link.stop(timeout)
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout)

    @property
    def link(self) -> LayerLink | None:
        """The channel-layer link to other processes, ``None`` without a cross-process layer."""
        return self._link

    # -- slots -----------------------------------------------------------
    def register(self, slot: Slot) -> Slot:
        with self._lock:
            self._slots[slot.approval_id] = slot
        return slot

    def unregister(self, slot: Slot) -> None:
        with self._lock:
            if self._slots.get(slot.approval_id) is slot:
                del self._slots[slot.approval_id]

    def pending_slots(self) -> int:
        with self._lock:
            return len(self._slots)

    def ensure_lease(self) -> None:
        """Write this process's lease before its first waiter (once per process)."""
        if self._lease_written:
            return
        from .models import ProcessLease

        ProcessLease.objects.update_or_create(
            key=self.key,
            defaults={
                "hostname": socket.gethostname()[:255],
                "pid": self.pid,
                "heartbeat_at": timezone.now(),
            },
        )
        self._lease_written = True
        self._last_heartbeat = time.monotonic()

    # -- subscribers -----------------------------------------------------
    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        """Call ``callback(event)`` for every event; it must be thread-safe and not block."""
        with self._lock:
            self._subscribers.add(callback)
        self._kick.set()
        return lambda: self._unsubscribe(callback)

    def _unsubscribe(self, callback: Subscriber) -> None:
        with self._lock:
            self._subscribers.discard(callback)

    # -- events ----------------------------------------------------------
    def deliver(self, event: dict) -> bool:
        """Hand an event to local slots and subscribers; False if it was already seen."""
        aid = event.get("approval_id")
        kind = event.get("type")
        with self._lock:
            if kind == "tool_decision":
                slot = self._slots.get(aid)
                if slot is not None:
                    slot.set(event["status"])
                if self._seen.get(aid) in FINAL_STATUSES:
                    return False
                self._remember(aid, event["status"])
            elif kind == "tool_start":
                if aid in self._seen:
                    return False
                self._remember(aid, "pending")
            subscribers = list(self._subscribers)
        for callback in subscribers:
            try:
                callback(event)
            except Exception:  # one broken socket must not starve the others
                logger.exception("approvals subscriber failed")
        return True

    def _remember(self, aid: str, status: str) -> None:
        self._seen[aid] = status
        self._seen.move_to_end(aid)
        while len(self._seen) > _SEEN_MAX:
            self._seen.popitem(last=False)

    def publish(self, event: dict) -> None:
        """Deliver locally, then send to the other processes (never blocks the caller)."""
        self.deliver(event)
        if self._link is not None:
            self._link.send({"type": "approvals.event", "origin": self.key, "event": _wire(event)})

    def _on_layer_message(self, message: dict) -> None:
        if message.get("origin") == self.key:
            return
        event = message.get("event")
        if not isinstance(event, dict):
            return
        if event.get("type") == "rules_changed":
            from . import rules

            rules.invalidate(local_only=True)
            return
        self.deliver(event)

    # -- the database re-check ------------------------------------------
    def _run_recheck(self) -> None:
        while not self._stop.is_set():
            self._kick.wait(float(setting("RECHECK_INTERVAL")))
            self._kick.clear()
            if self._stop.is_set():
                break
            try:
                self.recheck()
            except Exception as exc:
                # This thread must outlive any failure (a database outage, a
                # connection gone bad): it is what wakes waiters when messages
                # are lost. Drop the connection and try again next pass.
                logger.warning("approvals: database re-check failed: %s", exc)
                _drop_connection()
        try:
            connection.close()
        except Exception:
            pass

    def recheck(self) -> None:
        """One pass: decisions for local slots and sockets, new calls for sockets,
        heartbeat, sweep."""
        with self._lock:
            waiting = list(self._slots)
            has_subscribers = bool(self._subscribers)
        now = time.monotonic()
        if waiting or has_subscribers:
            # Rows decided lately (an indexed range, not one look-up per waiter),
            # then, now and then, every waiting id: the net under the net, for a
            # decision committed later than the tail's overlap allows.
            for event in self._tail.poll_decided(self._is_known_final):
                self.deliver(event)
            if waiting and now - self._last_full_check >= _FULL_CHECK_SECONDS:
                self._last_full_check = now
                for event in _decided_among(waiting):
                    self.deliver(event)
        else:
            self._tail.reset_decided()
        if has_subscribers:
            for event in self._tail.poll_created():
                self.deliver(event)
        else:
            self._tail.reset_created()
        if self._lease_written and now - self._last_heartbeat >= setting("HEARTBEAT_INTERVAL"):
            self._heartbeat()
            self._last_heartbeat = now
        interval = setting("SWEEP_INTERVAL")
        if interval and now - self._last_sweep >= interval:
            self._last_sweep = now
            from .decisions import abandon_orphans, expire_overdue

            if self._lease_written:
                # Our own lease first: this process is alive, whatever became of its
                # row (a restored backup, a test run's flush), so it never abandons
                # calls it is itself waiting for.
                self._heartbeat()
                self._last_heartbeat = now
            expire_overdue()
            abandon_orphans(setting("LEASE_TIMEOUT"))
        if not waiting and not has_subscribers:
            connection.close()  # an idle process holds no database connection

    def _is_known_final(self, approval_id: str, status: str) -> bool:
        with self._lock:
            return self._seen.get(approval_id) == status

    def _heartbeat(self) -> None:
        from .models import ProcessLease

        n = ProcessLease.objects.filter(key=self.key).update(heartbeat_at=timezone.now())
        if not n:
            self._lease_written = False
            self.ensure_lease()


def _drop_connection() -> None:
    try:
        close_old_connections()
        connection.close()
    except Exception:
        pass


def _wire(event: dict) -> dict:
    """The event as the layer can encode it: a user's primary key that is not an int
    or a string (a UUID, say) travels as its string; consumers compare as strings."""
    user_id = event.get("_user_id")
    if user_id is None or isinstance(user_id, int | str):
        return event
    return {**event, "_user_id": str(user_id)}


def _decided_among(approval_ids: list[str]) -> list[dict]:
    from .models import Approval, Status

    events = []
    for start in range(0, len(approval_ids), 500):
        chunk = approval_ids[start : start + 500]
        qs = Approval.objects.filter(approval_id__in=chunk).exclude(status=Status.PENDING)
        events.extend(_decision_events(qs))
    return events


_DECISION_FIELDS = ("approval_id", "session_id", "user_id", "status", "decided_via", "reason")


def _decision_events(qs) -> list[dict]:
    """``tool_decision`` events for decided rows, with who decided, in one query."""
    from django.contrib.auth import get_user_model
    from django.db.models import F

    from . import events

    name = F(f"decided_by__{get_user_model().USERNAME_FIELD}")
    rows = qs.annotate(decided_by_name=name).values(*_DECISION_FIELDS, "decided_by_name")
    return [
        events.tool_decision(
            row, row["status"], row["decided_via"], row["decided_by_name"], row["reason"]
        )
        for row in rows
    ]


class _Tail:
    """Rows created or decided since the last look, found by id and by decided_at."""

    def __init__(self) -> None:
        self.reset_created()
        self.reset_decided()

    def reset_created(self) -> None:
        self.last_pk: int | None = None
        self.holes: dict[int, float] = {}

    def reset_decided(self) -> None:
        self.decided_mark = None

    def poll_created(self) -> list[dict]:
        from django.db.models import Max, Q

        from . import events
        from .models import Approval

        if self.last_pk is None:
            # Start a little in the past: a socket that subscribed and read its
            # snapshot just before this first look must not miss a row committed
            # in between (it drops what its snapshot already holds).
            start = timezone.now() - _START_OVERLAP
            older = Approval.objects.filter(created_at__lt=start)
            self.last_pk = older.aggregate(m=Max("pk"))["m"] or 0
        out: list[dict] = []
        fields = ["pk", "user_id", "status", *events.PENDING_FIELDS]
        query = Q(pk__gt=self.last_pk)
        if self.holes:
            query |= Q(pk__in=list(self.holes))
        rows = list(Approval.objects.filter(query).order_by("pk").values(*fields)[:2000])
        now = time.monotonic()
        for row in rows:
            self.holes.pop(row["pk"], None)
            if row["pk"] > self.last_pk:
                # Ids are handed out before commit: a gap may still fill in.
                for missing in range(self.last_pk + 1, row["pk"]):
                    self.holes[missing] = now
                self.last_pk = row["pk"]
            out.append(events.tool_start(row))
        self.holes = {pk: t for pk, t in self.holes.items() if now - t < _HOLE_SECONDS}
        return out

    def poll_decided(self, known: Callable[[str, str], bool]) -> list[dict]:
        """``tool_decision`` events for rows decided lately that ``known`` has not seen.

        ``decided_at`` is set before commit, so each look reaches back
        ``_DECIDED_OVERLAP``; a first light query finds what is new, and only
        that is read in full.
        """
        from .models import Approval, Status

        mark = timezone.now()
        if self.decided_mark is None:
            self.decided_mark = mark - _START_OVERLAP
        recent = Approval.objects.filter(
            decided_at__gte=self.decided_mark - _DECIDED_OVERLAP
        ).exclude(status=Status.PENDING)
        new = [
            aid
            for aid, status in recent.values_list("approval_id", "status")
            if not known(aid, status)
        ]
        self.decided_mark = mark
        if not new:
            return []
        return _decided_among(new)


def _cross_process_layer():
    """Kept for callers that ask whether a cross-process layer is configured."""
    return own_layer_instance(setting("CHANNEL_LAYER"))


_listener: Listener | None = None
_create_lock = threading.Lock()


def get_listener() -> Listener:
    """This process's listener, started on first use (and again after a fork)."""
    global _listener
    current = _listener
    if current is not None and current.pid == os.getpid():
        return current
    with _create_lock:
        if _listener is None or _listener.pid != os.getpid():
            fresh = Listener()
            fresh.start()  # may refuse a bad configuration: then nothing half-started stays
            _listener = fresh
        return _listener


def dispatch(event: dict) -> None:
    """Publish an event from this process to every process's slots and sockets."""
    get_listener().publish(event)


def shutdown() -> None:
    """Stop this process's listener (a new one starts on next use)."""
    global _listener
    with _create_lock:
        if _listener is not None and _listener.pid == os.getpid():
            _listener.stop()
        _listener = None


def current() -> Listener | None:
    """This process's listener if one is running, without starting one."""
    found = _listener
    return found if found is not None and found.pid == os.getpid() else None
