"""The decision path stands on its own: deciding starts no thread and no listener."""

from __future__ import annotations

import threading
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.utils import timezone

from approvals import listener
from approvals.decisions import decide
from approvals.models import Approval, Status, Via

pytestmark = pytest.mark.django_db(transaction=True)


def _row(approval_id: str, **fields) -> Approval:
    now = timezone.now()
    defaults = {"session_id": "s", "tool_name": "t", "expires_at": now + timedelta(hours=1)}
    return Approval.objects.create(approval_id=approval_id, **{**defaults, **fields})


def test_deciding_starts_no_thread():
    listener.shutdown()
    _row("decide-alone")
    before = {t.ident for t in threading.enumerate()}
    outcome = decide("decide-alone", Status.ALLOWED, via=Via.API)
    assert outcome.won and outcome.status == Status.ALLOWED
    assert listener.current() is None
    assert {t.ident for t in threading.enumerate()} - before == set()
    assert Approval.objects.get(approval_id="decide-alone").status == Status.ALLOWED


def test_the_sweep_command_starts_no_listener():
    listener.shutdown()
    _row("sweep-alone", expires_at=timezone.now() - timedelta(seconds=1))
    out = StringIO()
    call_command("approvals_sweep", stdout=out)
    assert "expired 1" in out.getvalue()
    assert listener.current() is None
    assert Approval.objects.get(approval_id="sweep-alone").status == Status.EXPIRED


# -- a person answering their own agent's call: the fewest statements ----------------------


@pytest.fixture
def owner(django_user_model):
    return django_user_model.objects.create_user("owner-one-statement")


def _approval_queries(fn) -> list[str]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as ctx:
        outcome = fn()
    table = Approval._meta.db_table
    return outcome, [q["sql"] for q in ctx.captured_queries if table in q["sql"]]


def test_own_call_is_decided_in_the_fewest_statements(owner):
    """PostgreSQL: one ``UPDATE … RETURNING``. SQLite: a prepared read, then the update
    (an update there takes the one write lock even when it matches nothing)."""
    from django.db import connection

    _row("own-one", user=owner, session_id="s-own", editable=True)
    seen: list[dict] = []
    from approvals import listener as listener_module

    real_dispatch = listener_module.dispatch
    listener_module.dispatch = seen.append
    try:
        outcome, queries = _approval_queries(
            lambda: decide(
                "own-one", Status.ALLOWED, via=Via.WEB, by=owner, viewer=owner, remember="always"
            )
        )
    finally:
        listener_module.dispatch = real_dispatch
    assert outcome.won and outcome.status == Status.ALLOWED
    if connection.vendor == "postgresql":
        # No read of the row before the write: the update itself says who won.
        assert [q.split()[0] for q in queries] == ["UPDATE"]
        assert "RETURNING" in queries[0]
    else:
        assert [q.split()[0] for q in queries] == ["SELECT", "UPDATE"]
        assert "RETURNING" not in queries[1]
    row = Approval.objects.get(approval_id="own-one")
    assert (row.status, row.decided_via, row.decided_by_id) == ("allowed", "web", owner.pk)
    # What the statement returned fed the rule and the event as a read would have.
    from approvals.models import Rule

    rule = Rule.objects.get(user=owner)
    assert (rule.tool_name, rule.decision, rule.session_id) == ("t", "allow", "")
    [event] = [e for e in seen if e["type"] == "tool_decision"]
    assert (event["approval_id"], event["session_id"], event["_user_id"]) == (
        "own-one",
        "s-own",
        owner.pk,
    )


def test_one_statement_path_keeps_every_check(owner, django_user_model):
    other = django_user_model.objects.create_user("someone-else")
    now = timezone.now()
    _row("own-session", user=owner, session_id="s-a")
    _row("own-late", user=owner, expires_at=now - timedelta(seconds=1))
    _row("not-theirs", user=other)
    _row("own-decided", user=owner, status=Status.DENIED)

    # Another session named: not found, and nothing changed.
    wrong = decide(
        "own-session", Status.ALLOWED, via=Via.WEB, by=owner, viewer=owner, session_id="s-b"
    )
    assert (wrong.won, wrong.error) == (False, "not_found")
    # Past its deadline: the call is expired, the answer loses.
    late = decide("own-late", Status.ALLOWED, via=Via.WEB, by=owner, viewer=owner)
    assert (late.won, late.status, late.error) == (False, Status.EXPIRED, "already_decided")
    # Someone else's call, for a person without the permission: not found.
    theirs = decide("not-theirs", Status.ALLOWED, via=Via.WEB, by=owner, viewer=owner)
    assert (theirs.won, theirs.error) == (False, "not_found")
    # Decided already: says so, and keeps the first answer.
    again = decide("own-decided", Status.ALLOWED, via=Via.WEB, by=owner, viewer=owner)
    assert (again.won, again.status, again.error) == (False, Status.DENIED, "already_decided")
    statuses = dict(Approval.objects.values_list("approval_id", "status"))
    assert statuses == {
        "own-session": "pending",
        "own-late": "expired",
        "not-theirs": "pending",
        "own-decided": "denied",
    }
    # The right session wins.
    right = decide(
        "own-session", Status.DENIED, via=Via.WEB, by=owner, viewer=owner, session_id="s-a"
    )
    assert right.won and Approval.objects.get(approval_id="own-session").status == "denied"


def test_a_rule_that_cannot_apply_rolls_the_one_statement_decision_back(owner):
    from approvals.errors import RequestError

    _row("own-nosession", user=owner, session_id="")
    with pytest.raises(RequestError):
        decide(
            "own-nosession",
            Status.ALLOWED,
            via=Via.WEB,
            by=owner,
            viewer=owner,
            remember="session",
        )
    assert Approval.objects.get(approval_id="own-nosession").status == Status.PENDING


def test_the_prepared_read_gives_what_the_orm_gives(owner):
    from approvals import knownrows

    schema = {"type": "object", "properties": {"paths": {"type": "array"}}}
    _row("read-me", user=owner, editable=True, arguments_schema=schema, tool_call_id="c-1")
    _row("read-plain", session_id="")
    for aid in ("read-me", "read-plain"):
        orm = Approval.objects.filter(approval_id=aid).values(*knownrows.FIELDS, "status").get()
        assert knownrows.stored(aid) == orm
    assert knownrows.stored("read-me")["editable"] is True
    assert knownrows.stored("read-me")["arguments_schema"] == schema
    assert knownrows.stored("no-such-call") is None


# -- the update alone: no transaction when nothing else is written ----------------------


@pytest.fixture
def atomic_blocks(monkeypatch):
    """How many atomic blocks the decision path opens."""
    from approvals import aftercommit

    opened: list[int] = []
    real = aftercommit.transaction.atomic

    def counting(*args, **kwargs):
        opened.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(aftercommit.transaction, "atomic", counting)
    return opened


@pytest.mark.parametrize("own", [True, False], ids=["own-call", "by-id"])
def test_a_lone_update_opens_no_transaction_and_still_wakes(owner, atomic_blocks, own):
    from approvals import gate

    aid = f"lone-{own}"
    slot = gate.begin_tool_decision("s-lone", aid, user=owner, tool_name="t")
    atomic_blocks.clear()  # gating's own
    viewer = {"by": owner, "viewer": owner} if own else {}
    outcome = decide(aid, Status.ALLOWED, via=Via.WEB if own else Via.API, **viewer)
    assert outcome.won
    assert atomic_blocks == []  # the conditional update committed by itself
    assert gate.wait_tool_decision(slot, aid, timeout=5) == "allow"  # woken after it
    assert decide(aid, Status.DENIED, via=Via.API).error == "already_decided"


def test_a_hook_that_writes_gets_the_transaction_and_can_roll_it_back(owner, atomic_blocks):
    from approvals import hooks

    _row("hooked", user=owner)
    _row("hooked-off", user=owner)
    wanted = {"now": True}

    def failing(pk, status):
        raise RuntimeError("the hook's write failed")

    hooks.on_decided("test-failing", failing, writes=lambda: wanted["now"])
    try:
        with pytest.raises(RuntimeError):
            decide("hooked", Status.ALLOWED, via=Via.WEB, by=owner, viewer=owner)
        assert atomic_blocks == [1]
        assert Approval.objects.get(approval_id="hooked").status == Status.PENDING
        wanted["now"] = False  # it says it would write nothing: not called, no transaction
        assert decide("hooked-off", Status.ALLOWED, via=Via.WEB, by=owner, viewer=owner).won
        assert atomic_blocks == [1]
    finally:
        hooks._decided.pop("test-failing")
        hooks._decided_writes.pop("test-failing")
    assert not hooks.decided_writes()


def test_remembering_a_rule_keeps_the_transaction(owner, atomic_blocks):
    _row("remembered", user=owner, session_id="s-r")
    assert decide(
        "remembered", Status.ALLOWED, via=Via.WEB, by=owner, viewer=owner, remember="session"
    ).won
    assert atomic_blocks == [1]
