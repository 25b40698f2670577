"""The process listener: one per process, not one per waiter.

It holds this process's waiting slots and WebSocket subscribers and connects
them to the rest of the site:

* events made here (a call gated, a call decided) are delivered to local
  slots and sockets at once, then published on the channel layer for the other
  processes, from the link's own event loop (never a new loop per call);
* events from other processes arrive on one channel-layer group and are
  delivered the same way;
* a re-check thread asks the database (:mod:`approvals.dbtail`), once per
  interval for the whole process, for decisions on local slots and (when
  sockets are connected) for rows created or decided since it last looked.

It knows nothing of decisions, rules or HTTP. Other parts hook in from
``AppConfig.ready()``: :func:`on_message` for message types of their own
(rules use it to drop cached rules), :func:`every` for periodic work (the
sweep). Each event reaches a local socket at most once, whichever path brings
it first. The listener starts on first use by a part that serves live traffic
(the gate, the consumer, the views); :func:`dispatch` never starts it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from django.db import connection

from . import pgnotify
from .channellink import LayerLink, own_layer_instance, wire
from .conf import setting
from .daemon import drop_connection
from .dbtail import DatabaseTail, decided_among
from .dbwatch import Watcher, commit_mark, unchanged, watcher_for
from .leases import Lease, new_key
from .listenhooks import _handlers, _periodic, _starters
from .listenhooks import every as every  # re-exported: the hooks' public home
from .listenhooks import on_message as on_message
from .listenhooks import on_start as on_start
from .models import FINAL_STATUSES
from .waiting import Slot

logger = logging.getLogger("approvals.listener")

Subscriber = Callable[[dict], None]
_SEEN_MAX = 50_000
_FULL_CHECK_SECONDS = 30.0


class Listener:
    """This process's registry of slots and subscribers, and its links to other processes."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.key = new_key()
        self.lease = Lease(self.key)
        self._lock = threading.RLock()
        self._slots: dict[str, Slot] = {}
        self._subscribers: set[Subscriber] = set()
        self._seen: OrderedDict[str, str] = OrderedDict()
        self._stop = threading.Event()
        self._kick = threading.Event()
        self._link: LayerLink | None = None
        self._group = f"{setting('GROUP_PREFIX')}.events"
        self._tail = DatabaseTail()
        self._last_heartbeat = 0.0
        self._last_run: dict[str, float] = {}
        self._last_full_check = time.monotonic()
        self._last_full_tail = 0.0
        self._threads: list[threading.Thread] = []
        self._companions: list[Any] = []
        self._watcher: Watcher | None = None
        # Slots and sockets added so far, and where each read of a pass last stood.
        self._added = 0
        self._read_at: dict[str, tuple] = {}

    # -- lifecycle -------------------------------------------------------
    def start(self) -> None:
        layer = own_layer_instance(setting("CHANNEL_LAYER"))
        if layer is not None:
            self._link = LayerLink(layer, self._group, self._on_layer_message)
            self._link.start()
        self._last_run = {name: time.monotonic() for name in _periodic}
        if self._link is None:
            # Without a cross-process layer the database says when to look.
            self._watcher = watcher_for(
                connection.alias, self.kick, self._is_active, lambda p: pgnotify.handle(self, p)
            )
            if self._watcher is not None:
                self._watcher.start()
        t = threading.Thread(target=self._run_recheck, name="toolgate-recheck", daemon=True)
        t.start()
        self._threads.append(t)
        for name, starter in list(_starters.items()):
            try:
                self._companions.append(starter(self))
            except Exception:  # a companion that cannot start must not stop the listener
                logger.exception("approvals: %s did not start", name)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the threads (tests and interpreter exit)."""
        self._stop.set()
        self._kick.set()
        if self._link is not None:
            self._link.stop(timeout)
        for companion in self._companions:
            if hasattr(companion, "stop"):
                companion.stop(timeout)
        if self._watcher is not None:
            self._watcher.stop(timeout)
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout)

    @property
    def link(self) -> LayerLink | None:
        """The channel-layer link to other processes, ``None`` without a cross-process layer."""
        return self._link

    @property
    def watcher(self) -> Watcher | None:
        """The database watcher that kicks the re-check, ``None`` if there is none."""
        return self._watcher

    def kick(self) -> None:
        """Run a re-check pass now rather than at the next interval."""
        self._kick.set()

    def _is_active(self) -> bool:
        with self._lock:
            return bool(self._slots or self._subscribers)

    def _wake_watcher(self) -> None:
        if self._watcher is not None:
            self._watcher.wake()

    # -- slots -----------------------------------------------------------
    def register(self, slot: Slot) -> Slot:
        with self._lock:
            self._slots[slot.approval_id] = slot
            self._added += 1
        self._wake_watcher()
        return slot

    def unregister(self, slot: Slot) -> None:
        with self._lock:
            if self._slots.get(slot.approval_id) is slot:
                del self._slots[slot.approval_id]

    def has_slot(self, approval_id: str) -> bool:
        with self._lock:
            return approval_id in self._slots

    def pending_slots(self) -> int:
        with self._lock:
            return len(self._slots)

    def ensure_lease(self) -> None:
        """Write this process's lease before its first waiter (once per process)."""
        if not self.lease.written:
            self.lease.ensure()
            self._last_heartbeat = time.monotonic()

    # -- subscribers -----------------------------------------------------
    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        """Call ``callback(event)`` for every event; it must be thread-safe and not block."""
        with self._lock:
            self._subscribers.add(callback)
            self._added += 1
        self._kick.set()
        self._wake_watcher()
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

    def settle(self, aid: str, status: str) -> str:
        """A notification says call ``aid`` is now ``status``: wake a local waiter at once.

        Returns what the sockets here still need read from the row: ``"start"``,
        ``"decision"``, ``"unknown"`` (no status given) or ``""`` (nothing).
        """
        with self._lock:
            slot = self._slots.get(aid)
            if status in FINAL_STATUSES:
                if slot is not None:
                    slot.set(status)
                    if not self._subscribers and self._seen.get(aid) not in FINAL_STATUSES:
                        self._remember(aid, status)  # the tail need not read it again
                return "decision" if self._subscribers else ""
            if status:
                return "start" if self._subscribers else ""
            return "unknown" if self._subscribers or slot is not None else ""

    def _remember(self, aid: str, status: str) -> None:
        self._seen[aid] = status
        self._seen.move_to_end(aid)
        while len(self._seen) > _SEEN_MAX:
            self._seen.popitem(last=False)

    def publish(self, event: dict) -> None:
        """Deliver locally, then send to the other processes (never blocks the caller)."""
        self.deliver(event)
        if self._link is not None:
            self._link.send({"type": "approvals.event", "origin": self.key, "event": wire(event)})

    def _on_layer_message(self, message: dict) -> None:
        if message.get("origin") == self.key:
            return
        event = message.get("event")
        if not isinstance(event, dict):
            return
        handler = _handlers.get(event.get("type"))
        if handler is not None:
            handler(event)
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
                drop_connection()
        try:
            connection.close()
        except Exception:
            pass

    def recheck(self) -> None:
        """One pass: decisions for local slots and sockets, new calls for sockets,
        heartbeat, periodic tasks."""
        with self._lock:
            waiting = list(self._slots)
            has_subscribers = bool(self._subscribers)
        now = time.monotonic()
        if waiting or has_subscribers:
            self._read_tails(waiting, has_subscribers, now)
        if not waiting and not has_subscribers:
            self._tail.reset_decided()
        if not has_subscribers:
            self._tail.reset_created()
        if self.lease.written and now - self._last_heartbeat >= setting("HEARTBEAT_INTERVAL"):
            self._beat(now)
        self._run_periodic(now)
        if not waiting and not has_subscribers:
            connection.close()  # an idle process holds no database connection

    def _read_tails(self, waiting: list[str], has_subscribers: bool, now: float) -> None:
        """Rows decided lately (an indexed range, not one look-up per waiter); now and
        then every waiting id, the net under the net for a decision committed later
        than the tail's overlap allows; rows created, for sockets. A pass a watcher
        kicked looks back a moment, one a ``RECHECK_INTERVAL`` the whole overlap.

        On an SQLite file a read is skipped while nothing was committed and no slot
        or socket was added since it last ran (:func:`~approvals.dbwatch.commit_mark`):
        it would find what it found then. What this thread writes itself (its
        lease, the periodic tasks' decisions) is announced by the code that writes it.
        """
        with self._lock:
            added = self._added
        db = commit_mark(connection.alias)
        mark = None if db is None else (db, added)
        full = now - self._last_full_tail >= float(setting("RECHECK_INTERVAL"))
        if self._stale("full" if full else "tail", mark):
            if full:
                self._last_full_tail = now
            for event in self._tail.poll_decided(self._is_known_final, full=full):
                self.deliver(event)
            self._read("full" if full else "tail", mark)
        if waiting and now - self._last_full_check >= _FULL_CHECK_SECONDS:
            if self._stale("among", mark):
                for event in decided_among(waiting):
                    self.deliver(event)
                self._read("among", mark)
            self._last_full_check = now
        if has_subscribers and self._stale("created", mark):
            for event in self._tail.poll_created():
                self.deliver(event)
            self._read("created", mark)

    def _stale(self, read: str, mark: tuple | None) -> bool:
        """Whether ``read`` must run: marks are ``(commit mark, slots and sockets added)``."""
        before = self._read_at.get(read)
        return not (before and mark and before[1] == mark[1] and unchanged(before[0], mark[0]))

    def _read(self, read: str, mark: tuple | None) -> None:
        if mark is not None:
            self._read_at[read] = mark
            if read == "full":
                self._read_at["tail"] = mark  # it read all a quick look would

    def _run_periodic(self, now: float) -> None:
        for name, periodic in list(_periodic.items()):
            interval = periodic.interval()
            if not interval or now - self._last_run.setdefault(name, now) < interval:
                continue
            self._last_run[name] = now
            if periodic.judges_leases:
                # Our own lease first: this process is alive, whatever became of
                # its row (a restored backup, a test run's flush), so the task
                # never judges the calls it is itself waiting for.
                self._beat(now)
            periodic.task()

    def _beat(self, now: float) -> None:
        self.lease.beat()
        self._last_heartbeat = now

    def _is_known_final(self, approval_id: str, status: str) -> bool:
        with self._lock:
            return self._seen.get(approval_id) == status


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
    """Publish an event from this process through its listener, if one runs.

    Without a running listener nothing here waits or watches, and the other
    processes learn of the change from the database.
    """
    found = current()
    if found is not None:
        found.publish(event)


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
