"""Pydantic AI runs gated through toolgate, with the offline ``FunctionModel`` (no network)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.db import connections
from django.test import Client, override_settings

pytest.importorskip("pydantic_ai", reason="pydantic-ai-slim is not installed")

from pydantic_ai import (  # noqa: E402
    Agent,
    DeferredToolRequests,
    ModelResponse,
    TextPart,
    Tool,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel  # noqa: E402
from pydantic_ai.toolsets import FunctionToolset  # noqa: E402

from approvals import decisions, gate  # noqa: E402
from approvals.integrations.pydantic_ai import (  # noqa: E402
    GatedToolset,
    adeferred_results,
    defer_requests,
    deferred_results,
    gated,
)
from approvals.listener import get_listener  # noqa: E402
from approvals.models import Approval  # noqa: E402
from approvals.sweep import abandon_orphans  # noqa: E402

pytestmark = pytest.mark.django_db(transaction=True)

DENIED_WITH_REASON = "The user declined to run this tool call. Reason: not on a Friday"


@dataclass
class Deps:
    session_id: str
    user: Any = None


class Script:
    """A model that calls one tool, then answers with whatever the tool returned."""

    def __init__(self, tool: str, args: dict, call_id: str = "call_1") -> None:
        self.tool, self.args, self.call_id = tool, args, call_id
        self.received: list[Any] = []
        self.__name__ = f"script_{tool}"  # older FunctionModel versions name the model after it

    def __call__(self, messages, info: AgentInfo) -> ModelResponse:
        for part in messages[-1].parts:
            if isinstance(part, ToolReturnPart):
                self.received.append(part.content)
                return ModelResponse(parts=[TextPart(f"tool said: {part.content}")])
        return ModelResponse(parts=[ToolCallPart(self.tool, self.args, tool_call_id=self.call_id)])


class Tools:
    """A sync and an async tool that record that they ran."""

    def __init__(self) -> None:
        self.ran: list[tuple[str, Any]] = []

    def functions(self):
        def delete_file(path: str) -> str:
            """Delete a file."""
            self.ran.append(("delete_file", path))
            return f"deleted {path}"

        async def send_mail(to: str, subject: str) -> str:
            """Send an email."""
            await asyncio.sleep(0)
            self.ran.append(("send_mail", to))
            return f"sent to {to}"

        return [delete_file, send_mail]


def decide_when_pending(session_id: str, decision: str, reason: str = "", how=None):
    """From another thread: wait for the session's pending row, then decide it."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["row"] = row = _wait_for_pending(session_id)
            if how is not None:
                box["won"] = how(row)
            else:
                box["won"] = gate.resolve_tool_decision(
                    row.approval_id, decision, session_id, reason=reason
                )
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, box


def make_agent(script: Script, tools: Tools, **options):
    return Agent(
        FunctionModel(script), deps_type=Deps, toolsets=[gated(tools.functions(), **options)]
    )


def test_allow_runs_the_async_tool_and_its_result_reaches_the_model(django_user_model):
    alice = django_user_model.objects.create_user("alice")
    script, tools = Script("send_mail", {"to": "bob@example.com", "subject": "hi"}), Tools()
    agent = make_agent(script, tools)
    thread, box = decide_when_pending("chat-1", "allow")
    result = agent.run_sync("mail bob", deps=Deps("chat-1", alice))
    thread.join(10)
    assert box["won"] is True
    assert tools.ran == [("send_mail", "bob@example.com")]
    assert script.received == ["sent to bob@example.com"]
    assert result.output == "tool said: sent to bob@example.com"
    row = Approval.objects.get(approval_id=box["row"].approval_id)
    assert (row.status, row.tool_name, row.tool_call_id, row.user) == (
        "allowed",
        "send_mail",
        "call_1",
        alice,
    )
    assert row.arguments == {"to": "bob@example.com", "subject": "hi"}
    assert get_listener().pending_slots() == 0


def test_deny_with_reason_skips_the_sync_tool_and_the_model_gets_the_reason():
    script, tools = Script("delete_file", {"path": "/etc/hosts"}), Tools()
    agent = make_agent(script, tools)
    thread, box = decide_when_pending("chat-2", "deny", reason="not on a Friday")
    result = agent.run_sync("clean up", deps=Deps("chat-2"))
    thread.join(10)
    assert box["won"] is True
    assert tools.ran == []
    assert script.received == [DENIED_WITH_REASON]
    assert result.output == f"tool said: {DENIED_WITH_REASON}"


def test_decision_over_http_from_another_thread(django_user_model):
    alice = django_user_model.objects.create_user("alice", password="pw")
    script, tools = Script("delete_file", {"path": "/tmp/x"}), Tools()
    agent = make_agent(script, tools)

    def post(row) -> bool:
        client = Client()
        client.force_login(alice)
        body = {"approval_id": row.approval_id, "decision": "deny", "reason": "not on a Friday"}
        response = client.post(
            "/api/inference/tool-confirm", data=json.dumps(body), content_type="application/json"
        )
        box["http"] = (response.status_code, response.json())
        return response.status_code == 200

    thread, box = decide_when_pending("chat-http", "", how=post)
    agent.run_sync("clean up", deps=Deps("chat-http", alice))
    thread.join(10)
    assert box["http"][0] == 200 and box["http"][1]["status"] == "denied"
    assert tools.ran == []
    assert script.received == [DENIED_WITH_REASON]
    assert Approval.objects.get(approval_id=box["row"].approval_id).decided_via == "web"


RESOLVER = """
import sys, django
django.setup()
from approvals.gate import resolve_tool_decision
print(resolve_tool_decision(sys.argv[1], sys.argv[2], reason="from another process"))
"""


@override_settings(APPROVALS={"RECHECK_INTERVAL": 0.2})
def test_decision_from_another_os_process(child_env, python):
    script, tools = Script("delete_file", {"path": "/tmp/y"}), Tools()
    agent = make_agent(script, tools)
    box: dict[str, Any] = {}

    def run_agent() -> None:
        try:
            box["output"] = agent.run_sync("clean up", deps=Deps("chat-proc")).output
        finally:
            connections.close_all()

    runner = threading.Thread(target=run_agent)
    runner.start()
    row = _wait_for_pending("chat-proc")
    out = subprocess.run(
        [python, "-c", RESOLVER, row.approval_id, "allow"],
        env=child_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"
    runner.join(10)
    assert tools.ran == [("delete_file", "/tmp/y")]
    assert box["output"] == "tool said: deleted /tmp/y"


def _wait_for_pending(session_id: str) -> Approval:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        row = Approval.objects.filter(session_id=session_id, status="pending").first()
        if row is not None:
            return row
        time.sleep(0.02)
    raise AssertionError(f"no pending approval for {session_id}")


def test_timeout_feeds_the_expired_message():
    script, tools = Script("delete_file", {"path": "/x"}), Tools()
    agent = make_agent(script, tools, timeout=0.2)
    agent.run_sync("clean up", deps=Deps("chat-slow"))
    assert tools.ran == []
    assert script.received == [gate.EXPIRED_MESSAGE]
    assert Approval.objects.get(session_id="chat-slow").status == "expired"


def test_only_gates_the_named_tools_and_session_can_be_fixed():
    script, tools = Script("delete_file", {"path": "/x"}), Tools()
    agent = make_agent(script, tools, only={"send_mail"}, session_id="fixed")
    agent.run_sync("clean up")
    assert tools.ran == [("delete_file", "/x")]
    assert not Approval.objects.exists()


def test_a_run_without_a_session_fails_loudly():
    script, tools = Script("delete_file", {"path": "/x"}), Tools()
    agent = make_agent(script, tools)
    with pytest.raises(TypeError, match="session_id"):
        agent.run_sync("clean up", deps=None)
    assert tools.ran == []


# -- deferred: the run ends, a person decides while nothing waits, a new run resumes ----


def _deferred_agent(script: Script, tools: Tools):
    return Agent(
        FunctionModel(script),
        deps_type=Deps,
        output_type=[str, DeferredToolRequests],
        toolsets=[gated(tools.functions(), defer=True)],
    )


@pytest.mark.parametrize(
    ("decision", "ran", "received"),
    [
        ("allow", [("delete_file", "/srv/old")], "deleted /srv/old"),
        ("deny", [], DENIED_WITH_REASON),
    ],
)
def test_deferred_run_resumes_with_a_decision_made_while_nothing_waited(decision, ran, received):
    script, tools = Script("delete_file", {"path": "/srv/old"}, call_id="call_9"), Tools()
    agent = _deferred_agent(script, tools)
    first = agent.run_sync("clean up", deps=Deps("chat-def"))
    requests = first.output
    assert isinstance(requests, DeferredToolRequests)
    assert [p.tool_call_id for p in requests.approvals] == ["call_9"]
    row = Approval.objects.get(session_id="chat-def")
    assert (row.status, row.waiter) == ("pending", "")
    assert requests.metadata["call_9"]["approval_id"] == row.approval_id
    assert get_listener().pending_slots() == 0
    assert abandon_orphans(lease_timeout=0) == 0  # no waiter: the sweep leaves it alone

    assert deferred_results(requests, session_id="chat-def").approvals == {}
    assert gate.resolve_tool_decision(row.approval_id, decision, reason="not on a Friday")

    results = deferred_results(requests, session_id="chat-def")
    assert set(results.approvals) == {"call_9"}  # every deferred call has its answer
    second = agent.run_sync(
        message_history=first.all_messages(), deferred_tool_results=results, deps=Deps("chat-def")
    )
    assert tools.ran == ran
    assert script.received == [received]
    assert second.output == f"tool said: {received}"
    assert list(Approval.objects.values_list("approval_id", flat=True)) == [row.approval_id]


def test_native_requires_approval_maps_through_defer_requests():
    script, tools = Script("delete_file", {"path": "/srv/a"}, call_id="c-7"), Tools()
    delete_file = tools.functions()[0]
    agent = Agent(
        FunctionModel(script),
        output_type=[str, DeferredToolRequests],
        tools=[Tool(delete_file, requires_approval=True)],
    )
    first = agent.run_sync("clean up")
    requests = first.output
    verdicts = defer_requests(requests, session_id="chat-native")
    assert verdicts["c-7"].pending
    aid = requests.metadata["c-7"]["approval_id"]
    assert aid == Approval.objects.get(session_id="chat-native", tool_call_id="c-7").approval_id
    assert defer_requests(requests, session_id="chat-native")["c-7"].pending  # idempotent
    assert gate.resolve_tool_decision(aid, "deny", "chat-native", reason="not on a Friday")
    results = deferred_results(requests, session_id="chat-native")
    agent.run_sync(message_history=first.all_messages(), deferred_tool_results=results)
    assert tools.ran == []
    assert script.received == [DENIED_WITH_REASON]


def test_async_resume_waits_for_a_decision_made_later():
    script, tools = Script("send_mail", {"to": "a@b.c", "subject": "s"}), Tools()
    agent = _deferred_agent(script, tools)

    async def scenario():
        first = await agent.run("mail", deps=Deps("chat-wait"))
        thread, box = decide_when_pending("chat-wait", "allow")
        results = await adeferred_results(first.output, session_id="chat-wait", wait=True)
        thread.join(10)
        await agent.run(
            message_history=first.all_messages(),
            deferred_tool_results=results,
            deps=Deps("chat-wait"),
        )
        return box

    box = asyncio.run(scenario())
    assert box["won"] is True
    assert tools.ran == [("send_mail", "a@b.c")]
    assert script.received == ["sent to a@b.c"]


def test_forged_metadata_cannot_borrow_another_sessions_answer():
    script, tools = Script("delete_file", {"path": "/p"}, call_id="call_1"), Tools()
    agent = _deferred_agent(script, tools)
    other = agent.run_sync("x", deps=Deps("victim")).output
    victim_aid = other.metadata["call_1"]["approval_id"]
    gate.resolve_tool_decision(victim_aid, "allow")
    mine = agent.run_sync("x", deps=Deps("attacker")).output
    mine.metadata["call_1"]["approval_id"] = victim_aid
    assert deferred_results(mine, session_id="attacker").approvals == {}


def test_reused_call_id_with_other_arguments_is_asked_again():
    tools = Tools()
    first = Script("delete_file", {"path": "/a"}, call_id="call_0")
    agent = make_agent(first, tools, session_id="chat-reuse")
    thread, _ = decide_when_pending("chat-reuse", "allow")
    agent.run_sync("one")
    thread.join(10)
    second = Script("delete_file", {"path": "/b"}, call_id="call_0")
    agent = make_agent(second, tools, session_id="chat-reuse", timeout=0.2)
    agent.run_sync("two")
    assert tools.ran == [("delete_file", "/a")]
    assert second.received == [gate.EXPIRED_MESSAGE]
    assert Approval.objects.filter(session_id="chat-reuse").count() == 2


def test_an_approval_given_only_to_the_framework_does_not_run_the_tool():
    from pydantic_ai import DeferredToolResults

    script, tools = Script("delete_file", {"path": "/q"}, call_id="call_5"), Tools()
    agent = _deferred_agent(script, tools)
    first = agent.run_sync("clean up", deps=Deps("chat-bypass"))
    forged = DeferredToolResults(approvals={"call_5": True})  # toolgate's row is still pending
    second = agent.run_sync(
        message_history=first.all_messages(), deferred_tool_results=forged, deps=Deps("chat-bypass")
    )
    assert tools.ran == []
    assert isinstance(second.output, DeferredToolRequests)  # asked again, not run
    row = Approval.objects.get(session_id="chat-bypass")
    gate.resolve_tool_decision(row.approval_id, "deny")
    third = agent.run_sync(
        message_history=first.all_messages(), deferred_tool_results=forged, deps=Deps("chat-bypass")
    )
    assert tools.ran == []
    assert third.output == f"tool said: {gate.TOOL_REJECTED_MESSAGE}"


def test_the_example_runs_offline(child_env, python):
    out = subprocess.run(
        [
            python,
            "examples/pydantic_ai_gated.py",
            "--deferred",
            "--answer",
            "deny",
            "--reason",
            "no",
        ],
        cwd=str(Path(__file__).resolve().parent.parent),
        env=child_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "run ended with 1 call(s) awaiting approval" in out.stdout
    assert "The tool said: The user declined to run this tool call. Reason: no" in out.stdout
    assert "[tool]" not in out.stdout


def test_a_deferred_edit_resumes_through_override_args_and_is_marked_executed():
    script, tools = Script("delete_file", {"path": "/srv/all"}, call_id="call_e"), Tools()
    agent = _deferred_agent(script, tools)
    first = agent.run_sync("clean up", deps=Deps("chat-edit"))
    requests = first.output  # stored between the two runs: the approval id is in its metadata
    row = Approval.objects.get(session_id="chat-edit")
    assert row.editable and row.arguments_schema["properties"]["path"]["type"] == "string"
    won = decisions.decide(
        row.approval_id, "allowed", via="api", edited_arguments={"path": "/srv/old"}
    )
    assert won.won
    results = deferred_results(requests, session_id="chat-edit")
    assert results.approvals["call_e"].override_args == {"path": "/srv/old"}
    agent.run_sync(
        message_history=first.all_messages(), deferred_tool_results=results, deps=Deps("chat-edit")
    )
    assert tools.ran == [("delete_file", "/srv/old")]
    row.refresh_from_db()
    assert row.executed_at is not None and row.execution_ok is True


def test_waiting_edit_runs_the_edit(django_user_model):
    script, tools = Script("delete_file", {"path": "/a b"}), Tools()
    agent = make_agent(script, tools)

    def edit(row):
        return decisions.decide(
            row.approval_id, "allowed", via="api", edited_arguments={"path": "/a"}
        ).won

    thread, box = decide_when_pending("chat-wedit", "allow", how=edit)
    agent.run_sync("clean up", deps=Deps("chat-wedit"))
    thread.join(10)
    assert box["won"] is True
    assert tools.ran == [("delete_file", "/a")]
    assert gate.mark_executed(box["row"].approval_id) is False  # the adapter reported it


def test_gated_toolset_takes_only_and_still_reads_tools():
    assert GatedToolset(FunctionToolset([]), only={"a"}).only == {"a"}
    with pytest.warns(DeprecationWarning):
        assert GatedToolset(FunctionToolset([]), tools={"b"}).only == {"b"}
