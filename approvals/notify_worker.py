"""The outbox worker: sends webhook POSTs and emails, once each, whatever the number of processes.

One per process, started with the process listener (``listener.on_start``,
connected in ``AppConfig.ready()``), never in the thread that gates or
decides. Its thread claims due deliveries with a conditional update and a
lease (``claimed_until``), exactly as a decision is won: a row goes to the one
process whose update changed it; a claimer that dies leaves a lease that runs
out, and the row is claimed again. Sends run in a small thread pool, each with
its own timeout, so one slow receiver never delays another. Failures (network
errors, non-2xx answers) are retried with exponential backoff and jitter for
``WEBHOOK_RETRY_FOR`` seconds. The state lives in the database, so a restart
loses nothing.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import urllib.error
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta

from django.core.mail import send_mail
from django.db import connection
from django.db.models import F, Min, Q
from django.db.models.functions import Coalesce, Greatest
from django.utils import timezone

from . import __version__
from .conf import setting
from .daemon import drop_connection
from .dbwatch import commit_mark, unchanged
from .models import Delivery
from .notify_bodies import sign

logger = logging.getLogger("approvals.notify")

#: Seconds between looks at the outbox when nothing woke the worker.
POLL_INTERVAL = 1.0
#: The first retry's delay in seconds; each later one doubles, up to ``MAX_BACKOFF``.
FIRST_BACKOFF = 0.5
MAX_BACKOFF = 900.0


@dataclass
class Result:
    ok: bool
    status_code: int | None = None
    error: str = ""


def backoff(attempts: int) -> float:
    """Seconds before attempt ``attempts + 1``: doubling from ``FIRST_BACKOFF``, ±50 % jitter."""
    base = min(MAX_BACKOFF, FIRST_BACKOFF * 2 ** max(0, attempts - 1))
    return base * (0.5 + random.random())


def _due(now) -> Q:
    free = Q(claimed_until__isnull=True) | Q(claimed_until__lt=now)
    return Q(status="pending", next_attempt_at__lte=now) & free


def claim(owner: str, limit: int) -> tuple[str, list[Delivery]]:
    """Claim up to ``limit`` due deliveries for ``owner``: ``(token, rows)``.

    ``UPDATE … WHERE pk IN (…) AND due AND unclaimed``: a row another process
    claimed between the look and the update is not changed, so it is not ours.
    """
    now = timezone.now()
    ids = list(
        Delivery.objects.filter(_due(now))
        .order_by("next_attempt_at")
        .values_list("pk", flat=True)[:limit]
    )
    if not ids:
        return "", []
    token = f"{owner[:60]}:{uuid.uuid4().hex[:12]}"
    lease = now + timedelta(seconds=float(setting("WEBHOOK_TIMEOUT")) * 2 + 30)
    Delivery.objects.filter(_due(now), pk__in=ids).update(
        claimed_by=token, claimed_until=lease, attempts=F("attempts") + 1
    )
    rows = Delivery.objects.filter(pk__in=ids, claimed_by=token).select_related("webhook")
    return token, list(rows)


def next_due():
    """When the earliest pending delivery falls due: past its next attempt and its
    claim's lease (``None``: nothing pending)."""
    at = Greatest("next_attempt_at", Coalesce("claimed_until", "next_attempt_at"))
    return Delivery.objects.filter(status="pending").aggregate(due=Min(at))["due"]


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):  # a redirect is an answer, not a success
        return None


_opener = urllib.request.build_opener(_NoRedirect)


def post(delivery: Delivery) -> Result:
    """POST the stored body to the delivery's webhook, signed; 2xx is success."""
    hook = delivery.webhook
    body = delivery.body.encode()
    headers = {
        "Content-Type": "application/json",
        "User-Agent": f"toolgate/{__version__}",
        "X-Toolgate-Event": delivery.event,
        "X-Toolgate-Delivery": str(delivery.delivery_id),
        "X-Toolgate-Signature": sign(hook.secret or "", body),
    }
    request = urllib.request.Request(hook.url, data=body, headers=headers, method="POST")
    try:
        with _opener.open(request, timeout=float(setting("WEBHOOK_TIMEOUT"))) as response:
            response.read(65536)
            code = response.status
    except urllib.error.HTTPError as exc:
        return Result(False, exc.code, f"HTTP {exc.code} {exc.reason}")
    except Exception as exc:  # network errors, timeouts, bad URLs: all retried
        return Result(False, None, f"{type(exc).__name__}: {exc}"[:1000])
    if 200 <= code < 300:
        return Result(True, code)
    return Result(False, code, f"HTTP {code}")


def email(delivery: Delivery) -> Result:
    """Send the stored email with Django's mail."""
    try:
        data = json.loads(delivery.body)
        send_mail(data["subject"], data["message"], None, [delivery.email_to])
    except Exception as exc:
        return Result(False, None, f"{type(exc).__name__}: {exc}"[:1000])
    return Result(True)


def record(delivery: Delivery, token: str, result: Result) -> None:
    """Write what the attempt did, if the claim is still ours."""
    now = timezone.now()
    mine = Delivery.objects.filter(pk=delivery.pk, claimed_by=token)
    if result.ok:
        mine.update(
            status="delivered",
            delivered_at=now,
            last_status_code=result.status_code,
            last_error="",
            claimed_until=None,
        )
        return
    window = timedelta(seconds=float(setting("WEBHOOK_RETRY_FOR")))
    given_up = now >= delivery.created_at + window
    mine.update(
        status="failed" if given_up else "pending",
        next_attempt_at=now + timedelta(seconds=backoff(delivery.attempts)),
        last_status_code=result.status_code,
        last_error=result.error,
        claimed_until=None,
    )


def send_one(delivery: Delivery, token: str) -> Result:
    """One attempt at one claimed delivery, recorded."""
    result = post(delivery) if delivery.webhook_id else email(delivery)
    record(delivery, token, result)
    return result


class Worker:
    """This process's outbox worker: a claiming thread and a pool of senders."""

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.concurrency = max(1, int(setting("WEBHOOK_CONCURRENCY")))
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._busy = 0
        self._forced = False
        # After a look that claimed nothing (SQLite file): its commit mark, and when
        # the earliest pending delivery falls due (None: none pending).
        self._quiet: tuple | None = None
        self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="toolgate-send")
        self._thread = threading.Thread(target=self._run, name="toolgate-notify", daemon=True)

    def start(self) -> Worker:
        self._thread.start()
        return self

    def wake(self) -> None:
        """Look at the outbox now (called after a transaction that wrote deliveries)."""
        with self._lock:
            self._forced = True
        self._wake.set()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(POLL_INTERVAL)
            self._wake.clear()
            if self._stop.is_set():
                break
            try:
                self.pump()
            except Exception as exc:  # a database outage: try again next time
                logger.warning("approvals: outbox worker failed: %s", exc)
                drop_connection()
        drop_connection()

    def pump(self) -> int:
        """Claim as many due deliveries as there are free senders, and start them.

        On an SQLite file, a look that claimed nothing is not repeated until
        something is committed (:func:`~approvals.dbwatch.commit_mark`), the
        earliest pending delivery falls due, or :meth:`wake` is called: an idle
        process's once-a-second poll then costs microseconds.
        """
        with self._lock:
            free = self.concurrency - self._busy
            if free <= 0:
                return 0
            forced, self._forced = self._forced, False
        mark = commit_mark(connection.alias)
        if not forced and self._still_quiet(mark):
            return 0
        token, rows = claim(self.owner, free)
        self._quiet = None if rows or mark is None else (mark, next_due())
        for delivery in rows:
            with self._lock:
                self._busy += 1
            self._pool.submit(self._send, delivery, token)
        if len(rows) == free:
            self._wake.set()  # more may be due: look again when a sender is free
        return len(rows)

    def _still_quiet(self, mark: tuple | None) -> bool:
        if self._quiet is None or not unchanged(self._quiet[0], mark):
            return False
        due = self._quiet[1]
        return due is None or timezone.now() < due

    def _send(self, delivery: Delivery, token: str) -> None:
        try:
            send_one(delivery, token)
        except Exception:
            logger.exception("approvals: sending delivery %s failed", delivery.delivery_id)
        finally:
            with self._lock:
                self._busy -= 1
            self.wake()


_worker: Worker | None = None


def start(listener) -> Worker:
    """Start this process's worker (the listener's ``on_start`` hook); returns it."""
    global _worker
    _worker = Worker(listener.key).start()
    _worker.wake()
    return _worker


def current() -> Worker | None:
    return _worker


def wake() -> None:
    """Wake this process's worker, if it runs."""
    if _worker is not None:
        _worker.wake()
