"""Rules: always allow, always deny, remembered decisions, and reasons fed back."""

from __future__ import annotations

import subprocess
import threading
import time
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission
from django.core.exceptions import PermissionDenied
from django.db import connection, transaction
from django.test import override_settings
from django.utils import timezone

from approvals import decisions, gate, rules
from approvals.listener import get_listener
from approvals.models import Approval, Rule
from approvals.signals import approval_decided

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def alice(django_user_model):
    return django_user_model.objects.create_user("alice")


@pytest.fixture
def bob(django_user_model):
    return django_user_model.objects.create_user("bob")


@pytest.fixture
def decider(django_user_model):
    user = django_user_model.objects.create_user("dora")
    user.user_permissions.add(Permission.objects.get(codename="decide_approval"))
    return django_user_model.objects.get(pk=user.pk)  # fresh permission cache


def _begin(session="s1", tool="shell", arguments=None, user=None):
    aid = gate.new_approval_id()
    args = {"cmd": "ls"} if arguments is None else arguments
    return aid, gate.begin_tool_decision(session, aid, tool_name=tool, arguments=args, user=user)


def outcome(session="s1", tool="shell", arguments=None, user=None) -> str:
    """Gate one call: the status a rule gave it at once, or ``"pending"`` (then aborted)."""
    aid, slot = _begin(session, tool, arguments, user)
    status = Approval.objects.get(approval_id=aid).status
    if status == "pending":
        gate.abort_tool_decision(slot, aid)
    else:
        answer = {"allowed": "allow", "denied": "deny"}[status]
        assert gate.wait_tool_decision(slot, aid, timeout=0.01) == answer
    return status


def rule(**fields) -> Rule:
    fields.setdefault("decision", "allow")
    return Rule.objects.create(**fields)


# -- matching: scope, precedence, expiry ------------------------------------


def test_no_rule_asks():
    assert outcome() == "pending"


def test_allow_rule_answers_at_once_and_names_itself():
    r = rule(tool_name="shell")
    aid, slot = _begin()
    assert slot.status == "allowed"  # answered before begin returned
    started = time.perf_counter()
    assert gate.wait_tool_decision(slot, aid) == "allow"
    assert time.perf_counter() - started < 1.0  # not the hour-long timeout
    row = Approval.objects.get(approval_id=aid)
    assert (row.status, row.decided_via, row.decided_by) == ("allowed", "rule", None)
    assert row.reason == f"Allowed by rule #{r.pk} (shell)"
    assert row.decided_at == row.created_at
    assert row.waiter == ""


def test_rule_for_another_user_does_not_apply(alice, bob):
    rule(user=alice, tool_name="shell")
    assert outcome(user=alice) == "allowed"
    assert outcome(user=alice.pk) == "allowed"  # a pk works as well as the user
    assert outcome(user=bob) == "pending"
    assert outcome(user=None) == "pending"  # a call without a user: only every-user rules
    assert rules.match(str(alice.pk), "s1", "shell", {}) is not None


def test_rule_without_user_applies_to_every_user(alice, bob):
    rule(user=None, tool_name="shell")
    assert [outcome(user=u) for u in (alice, bob, None)] == ["allowed"] * 3


def test_session_rule_covers_only_its_session():
    rule(session_id="s1", tool_name="shell")
    assert outcome(session="s1") == "allowed"
    assert outcome(session="s2") == "pending"
    assert outcome(session="") == "pending"


def test_other_tools_still_ask():
    rule(tool_name="shell")
    assert outcome(tool="shell") == "allowed"
    assert outcome(tool="shell2") == "pending"
    assert outcome(tool="write_file") == "pending"


def test_tool_name_patterns():
    rule(tool_name="read_*")
    rule(tool_name="*_dangerous", decision="deny")
    assert outcome(tool="read_file") == "allowed"
    assert outcome(tool="read_dangerous") == "denied"
    assert outcome(tool="write_file") == "pending"


def test_arguments_match_patterns():
    rule(tool_name="shell", arguments_match={"cmd": "git status*"})
    assert outcome(arguments={"cmd": "git status"}) == "allowed"
    assert outcome(arguments={"cmd": "git status --short", "cwd": "/"}) == "allowed"
    assert outcome(arguments={"cmd": "git push"}) == "pending"
    assert outcome(arguments={"cmd": "ls; git status"}) == "pending"
    assert outcome(arguments={"command": "git status"}) == "pending"  # missing key: no match
    assert outcome(arguments={}) == "pending"


def test_every_argument_key_must_match():
    rule(tool_name="write_file", arguments_match={"path": "/tmp/*", "mode": "w"})
    assert outcome(tool="write_file", arguments={"path": "/tmp/x", "mode": "w"}) == "allowed"
    assert outcome(tool="write_file", arguments={"path": "/tmp/x", "mode": "a"}) == "pending"
    assert outcome(tool="write_file", arguments={"path": "/etc/x", "mode": "w"}) == "pending"
    assert outcome(tool="write_file", arguments={"path": "/tmp/x"}) == "pending"


def test_non_string_argument_values_match_their_json_text():
    rule(tool_name="fetch", arguments_match={"retries": "1", "follow": "true", "ids": "[1,*]"})
    args = {"retries": 1, "follow": True, "ids": [1, 2, 3]}
    assert outcome(tool="fetch", arguments=args) == "allowed"
    assert outcome(tool="fetch", arguments={**args, "retries": 2}) == "pending"
    assert outcome(tool="fetch", arguments={**args, "follow": "yes"}) == "pending"
    assert outcome(tool="fetch", arguments={**args, "ids": [2, 1]}) == "pending"


def test_deny_beats_every_allow(alice):
    rule(user=alice, session_id="s1", tool_name="shell")
    rule(tool_name="*", decision="allow")
    deny = rule(tool_name="sh*", decision="deny", arguments_match={"cmd": "rm *"})
    assert outcome(user=alice, arguments={"cmd": "ls"}) == "allowed"
    aid, slot = _begin(user=alice, arguments={"cmd": "rm -rf /"})
    assert gate.wait_tool_decision(slot, aid) == "deny"
    row = Approval.objects.get(approval_id=aid)
    assert (row.status, row.decided_via) == ("denied", "rule")
    assert row.reason == f"Denied by rule #{deny.pk} (sh*)"


def test_oldest_matching_rule_of_the_winning_kind_answers():
    first = rule(tool_name="*", decision="deny")
    rule(tool_name="shell", decision="deny")
    assert rules.match(None, "s1", "shell", {}).pk == first.pk


def test_expired_rules_are_ignored(monkeypatch):
    now = timezone.now()
    rule(tool_name="shell", decision="deny", expires_at=now - timedelta(seconds=1))
    rule(tool_name="shell", expires_at=now + timedelta(minutes=5))
    assert outcome() == "allowed"  # the expired deny does not beat the live allow
    later = now + timedelta(minutes=6)
    monkeypatch.setattr(timezone, "now", lambda: later)
    assert outcome() == "pending"  # expired while cached: ignored without a reload


def test_a_malformed_rule_matches_nothing():
    rule(tool_name="shell", arguments_match=["cmd"])
    Rule.objects.bulk_create([Rule(tool_name="shell", decision="")])  # skips validation
    rules.invalidate(local_only=True)
    assert outcome() == "pending"


# -- caching -------------------------------------------------------------------


def _count_rule_queries():
    seen: list[str] = []

    def wrapper(execute, sql, params, many, context):
        if "approvals_rule" in sql:
            seen.append(sql)
        return execute(sql, params, many, context)

    return seen, lambda: connection.execute_wrapper(wrapper)


def test_the_rule_table_is_not_queried_on_every_call():
    rule(tool_name="shell")
    seen, wrapping = _count_rule_queries()
    with override_settings(APPROVALS={"RULES_CACHE_SECONDS": 3600}):
        rules.match(None, "s1", "shell", {})  # warm
        with wrapping():
            for _ in range(200):
                assert rules.match(None, "s1", "shell", {}) is not None
        assert seen == []
    with override_settings(APPROVALS={"RULES_CACHE_SECONDS": 0}), wrapping():
        for n in range(1, 4):  # an expired cache costs the version check, not a reload
            assert rules.match(None, "s1", "shell", {}) is not None
            assert len(seen) == n
            assert "count" in seen[-1].lower()


def test_a_change_in_this_process_applies_at_once():
    with override_settings(APPROVALS={"RULES_CACHE_SECONDS": 3600}):
        assert outcome() == "pending"
        r = rule(tool_name="shell", decision="deny")
        assert outcome() == "denied"
        r.decision = "allow"
        r.save()
        assert outcome() == "allowed"
        r.delete()
        assert outcome() == "pending"


# -- across processes ------------------------------------------------------------

CHANGE_RULES = """
import sys, time, django
django.setup()
from approvals.models import Rule
if sys.argv[1] == "create":
    Rule.objects.create(tool_name="cross_tool", decision="allow", note="from another process")
else:
    Rule.objects.filter(tool_name="cross_tool").delete()
print(time.time(), flush=True)
time.sleep(float(sys.argv[2]))  # let a cross-process channel layer carry the news
"""


def _start_child(env, python, action: str, linger: float = 0.0):
    """Run CHANGE_RULES in another process; return it and when its change committed."""
    proc = subprocess.Popen(
        [python, "-c", CHANGE_RULES, action, str(linger)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()
    if not line:
        proc.wait(60)
        raise AssertionError(proc.stderr.read())
    return proc, float(line)


def _in_child(env, python, action: str) -> float:
    proc, committed = _start_child(env, python, action)
    assert proc.wait(60) == 0, proc.stderr.read()
    proc.stdout.close()
    proc.stderr.close()
    return committed


def _seconds_until(expected: str, since: float, limit: float = 3.0) -> float:
    while True:
        status = outcome(tool="cross_tool")
        if status == expected:
            return time.time() - since
        assert time.time() - since < limit, f"still {status!r} after {limit} s"
        time.sleep(0.01)


def _sleep_until(moment: float) -> None:
    time.sleep(max(0.0, moment - time.time()))


def test_rule_changed_in_another_process_applies_here_within_a_second(child_env, python):
    # A call gated RULES_CACHE_SECONDS (1 s) after the other process committed must see
    # the change, however loaded the machine is: the cache asks the database at most
    # that long after it last did.
    limit = rules.setting("RULES_CACHE_SECONDS")
    assert limit <= 1.0
    assert outcome(tool="cross_tool") == "pending"  # this process has the rules cached
    created = _in_child(child_env, python, "create")
    _sleep_until(created + limit + 0.02)
    assert outcome(tool="cross_tool") == "allowed"
    deleted = _in_child(child_env, python, "delete")
    _sleep_until(deleted + limit + 0.02)
    assert outcome(tool="cross_tool") == "pending"


@pytest.mark.redis
@override_settings(APPROVALS={"RULES_CACHE_SECONDS": 3600})
def test_with_redis_a_rule_change_arrives_in_milliseconds(child_env, python):
    from approvals.channellink import own_layer_instance

    if not rules.setting("GROUP_PREFIX") or own_layer_instance("default") is None:
        pytest.skip("runs in make test-services (needs the Redis channel layer)")
    get_listener()  # joined the group before the child publishes
    assert outcome(tool="cross_tool") == "pending"
    proc, created = _start_child(child_env, python, "create", linger=2.0)
    try:
        assert _seconds_until("allowed", created, limit=1.5) < 0.5  # not the hourly check
    finally:
        proc.wait(60)
        proc.stdout.close()
        proc.stderr.close()


# -- events and signals -------------------------------------------------------------


def test_rule_decided_call_is_announced_decided_and_signalled_once():
    rule(tool_name="shell")
    seen: list[dict] = []
    lock = threading.Lock()

    def collect(event):
        with lock:
            seen.append(event)

    decided: list[tuple] = []

    def on_decided(sender, approval, status, decided_via, decided_by, **kw):
        decided.append((approval.approval_id, status, decided_via, decided_by))

    unsubscribe = get_listener().subscribe(collect)
    approval_decided.connect(on_decided)
    try:
        aid, slot = _begin()
        assert gate.wait_tool_decision(slot, aid) == "allow"
        time.sleep(0.3)  # anything late (re-check, tail) would show up by now
    finally:
        unsubscribe()
        approval_decided.disconnect(on_decided)
    mine = [e for e in seen if e.get("approval_id") == aid]
    starts = [e for e in mine if e["type"] == "tool_start"]
    decisions_seen = [e for e in mine if e["type"] == "tool_decision"]
    assert len(starts) == 1 and starts[0]["awaiting_confirmation"] is False
    assert len(decisions_seen) == 1
    assert (decisions_seen[0]["status"], decisions_seen[0]["decided_via"]) == ("allowed", "rule")
    assert decided == [(aid, "allowed", "rule", None)]


def test_a_call_that_asks_is_announced_awaiting_confirmation():
    seen: list[dict] = []
    unsubscribe = get_listener().subscribe(seen.append)
    try:
        aid, slot = _begin()
        gate.abort_tool_decision(slot, aid)
    finally:
        unsubscribe()
    starts = [e for e in seen if e.get("approval_id") == aid and e["type"] == "tool_start"]
    assert [e["awaiting_confirmation"] for e in starts] == [True]


# -- remembering -------------------------------------------------------------------


def _decide(aid, answer="allow", **kw):
    status = decisions.status_for_answer(answer)
    kw.setdefault("via", "web")
    return decisions.decide(aid, status, **kw)


def test_remember_session_covers_this_user_session_and_tool(alice, bob):
    aid, slot = _begin(user=alice)
    assert _decide(aid, by=alice, viewer=alice, remember="session").won
    assert gate.wait_tool_decision(slot, aid) == "allow"
    r = Rule.objects.get()
    assert (r.user, r.session_id, r.tool_name, r.decision) == (alice, "s1", "shell", "allow")
    assert (r.created_by, r.arguments_match, r.expires_at) == (alice, None, None)
    assert outcome(user=alice) == "allowed"
    assert outcome(user=alice, arguments={"cmd": "anything else"}) == "allowed"
    assert outcome(user=alice, session="s2") == "pending"
    assert outcome(user=alice, tool="write_file") == "pending"
    assert outcome(user=bob) == "pending"


def test_remember_always_covers_every_session_of_this_user_and_tool(alice, bob):
    aid, slot = _begin(user=alice)
    assert _decide(aid, "deny", by=alice, viewer=alice, remember="always").won
    gate.abort_tool_decision(slot, aid)
    r = Rule.objects.get()
    assert (r.user, r.session_id, r.tool_name, r.decision) == (alice, "", "shell", "deny")
    assert outcome(user=alice, session="s1") == "denied"
    assert outcome(user=alice, session="elsewhere") == "denied"
    assert outcome(user=alice, tool="read_file") == "pending"
    assert outcome(user=bob) == "pending"


def test_remembering_twice_keeps_one_rule(alice):
    for _ in range(2):
        aid, slot = _begin(user=alice, tool="fresh_tool")
        if Approval.objects.get(approval_id=aid).status == "pending":
            assert _decide(aid, by=alice, viewer=alice, remember="always").won
        else:  # the first remembered rule already answers; remember again by hand
            rules.remember(
                {"approval_id": aid, "user_id": alice.pk, "session_id": "s1"}
                | {"tool_name": "fresh_tool"},
                "allowed",
                "always",
                alice,
            )
        gate.abort_tool_decision(slot, aid)
    assert Rule.objects.count() == 1


def test_a_deciders_remembered_rule_belongs_to_the_calls_user(alice, decider):
    aid, slot = _begin(user=alice)
    assert _decide(aid, by=decider, viewer=decider, remember="always").won
    gate.abort_tool_decision(slot, aid)
    r = Rule.objects.get()
    assert (r.user, r.created_by) == (alice, decider)
    assert outcome(user=alice) == "allowed"
    assert outcome(user=decider) == "pending"


def test_remembered_rule_for_a_call_without_user_covers_every_user(alice, decider):
    aid, slot = _begin(user=None)
    assert _decide(aid, by=decider, viewer=decider, remember="session").won
    gate.abort_tool_decision(slot, aid)
    assert Rule.objects.get().user is None
    assert outcome(user=alice, session="s1") == "allowed"
    assert outcome(user=alice, session="s2") == "pending"


def test_a_user_cannot_remember_a_rule_for_someone_elses_call(alice, bob):
    aid, slot = _begin(user=alice)
    with pytest.raises(PermissionDenied):
        _decide(aid, by=bob, remember="always")  # no viewer: the caller skipped the check
    assert Approval.objects.get(approval_id=aid).status == "pending"
    assert not Rule.objects.exists()
    gate.abort_tool_decision(slot, aid)


def test_remember_session_needs_a_session(alice):
    aid, slot = _begin(session="", user=alice)
    with pytest.raises(ValueError, match="session"):
        _decide(aid, by=alice, viewer=alice, remember="session")
    assert Approval.objects.get(approval_id=aid).status == "pending"
    assert not Rule.objects.exists()
    assert _decide(aid, by=alice, viewer=alice, remember="always").won
    gate.abort_tool_decision(slot, aid)


def test_a_rolled_back_decision_leaves_no_rule(alice):
    aid, slot = _begin(user=alice)
    with pytest.raises(RuntimeError), transaction.atomic():
        assert _decide(aid, by=alice, viewer=alice, remember="always").won
        assert Rule.objects.count() == 1
        raise RuntimeError("roll back")
    assert not Rule.objects.exists()
    assert Approval.objects.get(approval_id=aid).status == "pending"
    assert slot.status is None  # nobody woke
    assert outcome(user=alice, tool="shell") == "pending"
    gate.abort_tool_decision(slot, aid)


def test_remember_is_ignored_for_a_lost_decision(alice):
    aid, slot = _begin(user=alice)
    assert _decide(aid, by=alice).won
    assert _decide(aid, "deny", by=alice, remember="always").error == "already_decided"
    assert not Rule.objects.exists()
    gate.wait_tool_decision(slot, aid)


# -- reasons fed back -------------------------------------------------------------


def test_denial_message_carries_the_reason_whatever_the_channel(alice):
    for via in ("web", "websocket", "admin", "api"):
        aid, slot = _begin(user=alice)
        assert _decide(aid, "deny", via=via, by=alice, reason=f"not via {via} today").won
        assert gate.wait_tool_decision(slot, aid) == "deny"
        row = Approval.objects.get(approval_id=aid)
        assert (row.decided_via, row.reason) == (via, f"not via {via} today")
        expected = f"{gate.TOOL_REJECTED_MESSAGE} Reason: not via {via} today"
        assert gate.denial_message(aid) == expected


def test_denial_without_reason_is_the_plain_message(alice):
    aid, slot = _begin(user=alice)
    assert gate.resolve_tool_decision(aid, "deny", "s1", user=alice)
    gate.wait_tool_decision(slot, aid)
    assert gate.denial_message(aid) == gate.TOOL_REJECTED_MESSAGE


def test_a_deny_rules_note_reaches_the_model():
    r = rule(tool_name="deploy", decision="deny", note="Deploys go through CI, not the agent.")
    aid, slot = _begin(tool="deploy")
    assert gate.wait_tool_decision(slot, aid) == "deny"
    assert gate.denial_message(aid) == (
        f"{gate.TOOL_REJECTED_MESSAGE} Reason: Denied by rule #{r.pk} (deploy): "
        "Deploys go through CI, not the agent."
    )


def test_a_remembered_denials_reason_is_fed_back_on_later_calls(alice):
    aid, slot = _begin(user=alice)
    assert _decide(aid, "deny", by=alice, reason="use the read-only tool", remember="always").won
    gate.wait_tool_decision(slot, aid)
    later, slot = _begin(user=alice, session="s9")
    assert gate.wait_tool_decision(slot, later) == "deny"
    assert gate.denial_message(later).endswith("(shell): use the read-only tool")


# -- the admin -------------------------------------------------------------------

ADD_URL = "/admin/approvals/rule/add/"


def _staff(django_user_model, name, *perms):
    user = django_user_model.objects.create_user(name, is_staff=True)
    codenames = [*perms]
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    return django_user_model.objects.get(pk=user.pk)


def _rule_form(**fields):
    data = {
        "user": "",
        "session_id": "",
        "tool_name": "shell",
        "arguments_match": "",
        "decision": "allow",
        "expires_at_0": "",
        "expires_at_1": "",
        "note": "",
        "_save": "Save",
    }
    data.update(fields)
    return data


RULE_PERMS = ("add_rule", "change_rule", "view_rule", "delete_rule")


@pytest.fixture
def carol(django_user_model):
    """Staff who may manage rules but not decide others' calls."""
    return _staff(django_user_model, "carol", *RULE_PERMS)


def test_admin_user_can_create_a_rule_for_themselves_only(client, carol, alice):
    client.force_login(carol)
    assert client.get(ADD_URL).status_code == 200
    response = client.post(ADD_URL, _rule_form(user=alice.pk))
    assert response.status_code == 200  # the form again, with an error
    assert not Rule.objects.exists()
    response = client.post(ADD_URL, _rule_form(user=""))  # "every user" is not theirs either
    assert response.status_code == 200 and not Rule.objects.exists()
    response = client.post(ADD_URL, _rule_form(user=carol.pk, created_by=alice.pk))
    assert response.status_code == 302
    r = Rule.objects.get()
    assert (r.user, r.created_by, r.tool_name) == (carol, carol, "shell")


def test_admin_user_sees_and_edits_only_their_own_rules(client, carol, alice):
    mine = rule(user=carol, tool_name="mine")
    theirs = rule(user=alice, tool_name="theirs")
    everyones = rule(user=None, tool_name="everyones")
    client.force_login(carol)
    listing = client.get("/admin/approvals/rule/").content.decode()
    assert "mine" in listing and "theirs" not in listing and "everyones" not in listing
    for other in (theirs, everyones):
        url = f"/admin/approvals/rule/{other.pk}/change/"
        assert client.get(url).status_code == 302  # "does not exist", like any unknown id
        client.post(url, _rule_form(user=carol.pk, tool_name="stolen"))
        client.post(f"/admin/approvals/rule/{other.pk}/delete/", {"post": "yes"})
    assert set(Rule.objects.values_list("tool_name", flat=True)) == {"mine", "theirs", "everyones"}
    url = f"/admin/approvals/rule/{mine.pk}/change/"
    assert client.post(url, _rule_form(user=alice.pk, tool_name="mine")).status_code == 200
    assert Rule.objects.get(pk=mine.pk).user == carol  # cannot hand a rule to someone else
    assert client.post(url, _rule_form(user=carol.pk, tool_name="mine2")).status_code == 302
    assert Rule.objects.get(pk=mine.pk).tool_name == "mine2"


def test_a_decider_manages_every_rule_in_the_admin(client, django_user_model, alice):
    boss = _staff(django_user_model, "boss", "decide_approval")
    client.force_login(boss)
    theirs = rule(user=alice, tool_name="theirs")
    assert client.get(f"/admin/approvals/rule/{theirs.pk}/change/").status_code == 200
    assert client.post(ADD_URL, _rule_form(user=alice.pk, tool_name="a")).status_code == 302
    assert client.post(ADD_URL, _rule_form(user="", tool_name="b")).status_code == 302
    made = {r.tool_name: (r.user_id, r.created_by_id) for r in Rule.objects.all()}
    assert made["a"] == (alice.pk, boss.pk) and made["b"] == (None, boss.pk)


def test_admin_checks_arguments_match(client, carol):
    client.force_login(carol)
    for text in ('["cmd"]', '{"n": 1}', "{not json"):
        response = client.post(ADD_URL, _rule_form(user=carol.pk, arguments_match=text))
        assert response.status_code == 200, text  # the form again, with the error
        assert not Rule.objects.exists()
    good = _rule_form(user=carol.pk, arguments_match='{"cmd": "git status*", "n": "1"}')
    assert client.post(ADD_URL, good).status_code == 302
    assert Rule.objects.get().arguments_match == {"cmd": "git status*", "n": "1"}


@override_settings(APPROVALS={"RULES_CACHE_SECONDS": 3600})
def test_admin_changes_apply_at_once(client, carol):
    client.force_login(carol)
    assert outcome(user=carol) == "pending"  # rules cached for the next hour
    assert client.post(ADD_URL, _rule_form(user=carol.pk, decision="deny")).status_code == 302
    assert outcome(user=carol) == "denied"
    r = Rule.objects.get()
    url = f"/admin/approvals/rule/{r.pk}/change/"
    assert client.post(url, _rule_form(user=carol.pk, decision="allow")).status_code == 302
    assert outcome(user=carol) == "allowed"
    assert client.post(f"/admin/approvals/rule/{r.pk}/delete/", {"post": "yes"}).status_code == 302
    assert outcome(user=carol) == "pending"


# -- end to end: reasons and remembering through the entry points -----------------


def _confirm(client, **body):
    return client.post("/api/inference/tool-confirm", body, content_type="application/json")


def test_http_remember_and_reason_reach_the_rule_and_the_model(client, alice):
    client.force_login(alice)
    aid, slot = _begin(user=alice)
    response = _confirm(
        client, approval_id=aid, decision="deny", reason="not here", remember="always"
    )
    assert response.status_code == 200, response.content
    assert gate.wait_tool_decision(slot, aid) == "deny"
    assert gate.denial_message(aid) == f"{gate.TOOL_REJECTED_MESSAGE} Reason: not here"
    r = Rule.objects.get()
    assert (r.user, r.session_id, r.decision, r.note) == (alice, "", "deny", "not here")
    assert outcome(user=alice, session="other") == "denied"


def test_http_remember_session_without_a_session_is_a_400_and_changes_nothing(client, alice):
    client.force_login(alice)
    aid, slot = _begin(session="", user=alice)
    response = _confirm(client, approval_id=aid, decision="allow", remember="session")
    assert response.status_code == 400
    assert response.json()["error"] == "invalid_field"
    assert Approval.objects.get(approval_id=aid).status == "pending"
    assert not Rule.objects.exists()
    gate.abort_tool_decision(slot, aid)


def test_admin_deny_action_reason_reaches_the_model(client, decider):
    decider.is_staff = True
    decider.save()
    client.force_login(decider)
    aid, slot = _begin()
    pk = Approval.objects.get(approval_id=aid).pk
    response = client.post(
        "/admin/approvals/approval/",
        {"action": "deny_selected", "_selected_action": [pk], "post": "yes", "reason": "too risky"},
    )
    assert response.status_code == 302
    assert gate.wait_tool_decision(slot, aid) == "deny"
    assert gate.denial_message(aid) == f"{gate.TOOL_REJECTED_MESSAGE} Reason: too risky"


def test_a_rule_decided_call_holds_no_slot_even_if_nobody_waits():
    rule(tool_name="shell")
    before = get_listener().pending_slots()
    aid, slot = _begin()
    assert slot.status == "allowed"
    assert get_listener().pending_slots() == before
    assert gate.wait_tool_decision(slot, aid) == "allow"  # waiting afterwards still works


def test_remembered_rule_matches_a_starred_tool_name_literally(alice):
    aid, slot = _begin(user=alice, tool="read*")
    assert _decide(aid, by=alice, viewer=alice, remember="always").won
    assert gate.wait_tool_decision(slot, aid) == "allow"
    rule = Rule.objects.get()
    assert (rule.tool_name, rule.literal) == ("read*", True)
    assert outcome(user=alice, tool="read_secrets", session="other") == "pending"
    assert outcome(user=alice, tool="read", session="other") == "pending"
    assert outcome(user=alice, tool="read*", session="other") == "allowed"


def test_an_admin_written_star_is_still_a_pattern(alice):
    Rule.objects.create(user=alice, tool_name="read*", decision="allow")
    assert outcome(user=alice, tool="read_secrets") == "allowed"
