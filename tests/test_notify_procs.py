"""The outbox across real processes: a site restart loses nothing; two sites never send twice."""

from __future__ import annotations

import socket
import time
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from approvals import hooks, listener, outbox
from approvals.models import Approval, Delivery, Webhook
from tests import procs
from tests.conftest import requires_postgres
from tests.receiver import Receiver

APPROVALS = {"WEBHOOK_TIMEOUT": 2.0, "SITE_URL": "https://toolgate.example.com"}


@pytest.fixture
def quiet(transactional_db):
    listener.shutdown()  # this process sends nothing: only the sites do
    outbox.forget_webhooks()
    yield
    listener.shutdown()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gated(n: int = 1) -> list[Approval]:
    """Write ``n`` calls the way the gate does: the outbox rows in the same transaction."""
    made = []
    with transaction.atomic():
        for i in range(n):
            a = Approval.objects.create(
                approval_id=f"call-{i}-{time.monotonic_ns()}",
                session_id="run-1",
                tool_name="run_shell",
                expires_at=timezone.now() + timedelta(hours=1),
            )
            hooks.gated(a)
            made.append(a)
    return made


def _wait(predicate, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, list(Delivery.objects.values())[:3]
        time.sleep(0.1)


def test_a_delivery_written_while_the_receiver_is_down_arrives_after_a_restart(quiet, child_env):
    port = _free_port()
    Webhook.objects.create(url=f"http://127.0.0.1:{port}/hook", events=["approval.requested"])
    site = procs.wait_ready(procs.start_daphne(child_env, approvals=APPROVALS))
    receiver = None
    try:
        (approval,) = _gated()
        _wait(lambda: Delivery.objects.filter(attempts__gte=1, claimed_until=None).exists())
        row = Delivery.objects.get()
        assert row.status == "pending" and "Connection refused" in row.last_error
        site.proc.kill()  # no clean shutdown
        site.proc.wait(10)
        receiver = Receiver(port)
        time.sleep(2)
        assert receiver.requests == []  # nobody sends while the site is down
        site = procs.wait_ready(procs.start_daphne(child_env, approvals=APPROVALS))
        (request,) = receiver.wait_for(1, timeout=30)
    finally:
        site.stop()
        if receiver:
            receiver.close()
    assert request.headers["x-toolgate-delivery"] == str(row.delivery_id)
    assert request.json()["approval"]["approval_id"] == approval.approval_id
    _wait(lambda: Delivery.objects.get().status == "delivered")


def _race(child_env, count: int = 150) -> set[str]:
    """Two sites send ``count`` deliveries; each arrives once. Returns who sent them."""
    receiver = Receiver()
    # Each answer takes 50 ms: one site's 8 senders need about a second for 150
    # deliveries, the other site's 1-second poll of the outbox falls inside it.
    receiver.hang = 0.05
    Webhook.objects.create(url=receiver.url, events=["approval.requested"])
    sites = [procs.start_daphne(child_env, approvals=APPROVALS) for _ in range(2)]
    try:
        for site in sites:
            procs.wait_ready(site)
        time.sleep(1.5)  # both workers are polling the outbox
        _gated(count)
        receiver.wait_for(count, timeout=60)
        _wait(lambda: Delivery.objects.filter(status="delivered").count() == count)
        time.sleep(1.0)  # a duplicate, if any, has time to arrive
    finally:
        for site in sites:
            site.stop()
        receiver.close()
    ids = [r.headers["x-toolgate-delivery"] for r in receiver.requests]
    assert len(ids) == len(set(ids)) == count
    return {c.rsplit(":", 1)[0] for c in Delivery.objects.values_list("claimed_by", flat=True)}


def _race_with_both_sites(child_env, count: int = 150) -> None:
    # A race needs both sites claiming: on a busy machine one site can take every
    # delivery, so the race is run again (each run checks that nothing came twice).
    for _ in range(3):
        owners = _race(child_env, count)
        if len(owners) == 2:
            break
        Delivery.objects.all().delete()
        Webhook.objects.all().delete()
    assert len(owners) == 2, owners  # both processes sent some


def test_two_sites_never_send_the_same_delivery_twice(quiet, child_env):
    _race_with_both_sites(child_env)


@pytest.mark.postgres
@requires_postgres()
def test_two_sites_never_send_the_same_delivery_twice_on_postgresql(quiet, child_env):
    _race_with_both_sites(child_env, count=300)
