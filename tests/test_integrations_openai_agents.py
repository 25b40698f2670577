"""OpenAI Agents SDK runs gated through toolgate, with a fake offline ``Model`` (no network)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from django.db import connections
from django.test import Client, override_settings

pytest.importorskip("agents", reason="openai-agents is not installed")

from agents import (  # noqa: E402
    Agent,
    ModelResponse,
    Runner,
    RunState,
    Usage,
    function_tool,
    set_tracing_disabled,
)
from agents.exceptions import UserError  # noqa: E402
from agents.models.interface import Model  # noqa: E402
from openai.types.responses import (  # noqa: E402
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from approvals import decisions, gate  # noqa: E402
from approvals.integrations import approval_id_for  # noqa: E402
from approvals.integrations.openai_agents import (  # noqa: E402
    aapply_decisions,
    apply_decisions,
    defer_interruptions,
    gate_tool,
    gated_function_tool,
)
from approvals.listener import get_listener  # noqa: E402
from approvals.models import Approval  # noqa: E402
from approvals.sweep import abandon_orphans  # noqa: E402

pytestmark = pytest.mark.django_db(transaction=True)
set_tracing_disabled(True)

DENIED_WITH_REASON = "The user declined to run this tool call. Reason: not on a Friday"


class ScriptedModel(Model):
    """Calls one tool, then answers with whatever the tool output was."""

    def __init__(self, tool: str, args: dict, call_id: str = "call_1") -> None:
        self.tool, self.args, self.call_id = tool, args, call_id
        self.received: list[Any] = []

    async def get_response(self, system_instructions, input, *args, **kwargs) -> ModelResponse:
        items = input if isinstance(input, list) else []
        outputs = [i for i in items if _get(i, "type") == "function_call_output"]
        if outputs:
            output = _get(outputs[-1], "output")
            self.received.append(output)
            return _response(_message(f"tool said: {output}"))
        return _response(
            ResponseFunctionToolCall(
                id=f"fc_{self.call_id}",
                call_id=self.call_id,
                type="function_call",
                name=self.tool,
                arguments=json.dumps(self.args),
            )
        )

    def stream_response(self, *args, **kwargs):
        raise NotImplementedError("these tests do not stream")


def _get(item: Any, key: str) -> Any:
    return item.get(key) if isinstance(item, dict) else getattr(item, key, None)


def _response(item: Any) -> ModelResponse:
    return ModelResponse(output=[item], usage=Usage(), response_id=None)


def _message(text: str) -> ResponseOutputMessage:
    content = [ResponseOutputText(text=text, type="output_text", annotations=[])]
    return ResponseOutputMessage(
        id="msg_1", type="message", role="assistant", status="completed", content=content
    )


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

    def gated(self, **options):
        return [gated_function_tool(f, **options) for f in self.functions()]


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


def test_allow_runs_the_async_tool_and_its_result_reaches_the_model(django_user_model):
    alice = django_user_model.objects.create_user("alice")
    model, tools = ScriptedModel("send_mail", {"to": "bob@example.com", "subject": "hi"}), Tools()
    agent = Agent(name="mailer", model=model, tools=tools.gated())
    thread, box = decide_when_pending("chat-1", "allow")
    result = Runner.run_sync(agent, "mail bob", context={"session_id": "chat-1", "user": alice})
    thread.join(10)
    assert box["won"] is True
    assert tools.ran == [("send_mail", "bob@example.com")]
    assert model.received == ["sent to bob@example.com"]
    assert result.final_output == "tool said: sent to bob@example.com"
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
    model, tools = ScriptedModel("delete_file", {"path": "/etc/hosts"}), Tools()
    agent = Agent(name="ops", model=model, tools=tools.gated())
    thread, box = decide_when_pending("chat-2", "deny", reason="not on a Friday")
    result = Runner.run_sync(agent, "clean up", context={"session_id": "chat-2"})
    thread.join(10)
    assert box["won"] is True
    assert tools.ran == []
    assert model.received == [DENIED_WITH_REASON]
    assert result.final_output == f"tool said: {DENIED_WITH_REASON}"


def test_decision_over_http_from_another_thread(django_user_model):
    alice = django_user_model.objects.create_user("alice", password="pw")
    model, tools = ScriptedModel("delete_file", {"path": "/tmp/x"}), Tools()
    agent = Agent(name="ops", model=model, tools=tools.gated())

    def post(row) -> bool:
        client = Client()
        client.force_login(alice)
        body = {"approval_id": row.approval_id, "decision": "allow", "session_id": "chat-http"}
        response = client.post(
            "/api/inference/tool-confirm", data=json.dumps(body), content_type="application/json"
        )
        box["http"] = (response.status_code, response.json())
        return response.status_code == 200

    thread, box = decide_when_pending("chat-http", "", how=post)
    Runner.run_sync(agent, "clean up", context={"session_id": "chat-http", "user": alice})
    thread.join(10)
    assert box["http"] == (
        200,
        {"resolved": True, "approval_id": box["row"].approval_id, "status": "allowed"},
    )
    assert tools.ran == [("delete_file", "/tmp/x")]
    assert model.received == ["deleted /tmp/x"]


RESOLVER = """
import sys, django
django.setup()
from approvals.gate import resolve_tool_decision
print(resolve_tool_decision(sys.argv[1], sys.argv[2], reason=sys.argv[3]))
"""


@override_settings(APPROVALS={"RECHECK_INTERVAL": 0.2})
def test_decision_from_another_os_process(child_env, python):
    model, tools = ScriptedModel("delete_file", {"path": "/tmp/y"}), Tools()
    agent = Agent(name="ops", model=model, tools=tools.gated(session_id="chat-proc"))
    box: dict[str, Any] = {}

    def run_agent() -> None:
        try:
            box["output"] = Runner.run_sync(agent, "clean up").final_output
        finally:
            connections.close_all()

    runner = threading.Thread(target=run_agent)
    runner.start()
    row = _wait_for_pending("chat-proc")
    out = subprocess.run(
        [python, "-c", RESOLVER, row.approval_id, "deny", "not on a Friday"],
        env=child_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"
    runner.join(10)
    assert tools.ran == []
    assert box["output"] == f"tool said: {DENIED_WITH_REASON}"


def _wait_for_pending(session_id: str) -> Approval:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        row = Approval.objects.filter(session_id=session_id, status="pending").first()
        if row is not None:
            return row
        time.sleep(0.02)
    raise AssertionError(f"no pending approval for {session_id}")


def test_gate_tool_wraps_an_existing_tool_and_a_context_callable_supplies_the_session():
    model, tools = ScriptedModel("delete_file", {"path": "/z"}), Tools()
    plain = function_tool(tools.functions()[0])
    tool = gate_tool(plain, context=lambda ctx: {"session_id": ctx.context["chat"]}, timeout=0.2)
    agent = Agent(name="ops", model=model, tools=[tool])
    Runner.run_sync(agent, "clean up", context={"chat": "chat-ctx"})
    assert tools.ran == []
    assert model.received == [gate.EXPIRED_MESSAGE]
    assert Approval.objects.get(session_id="chat-ctx").status == "expired"


def test_a_run_without_a_session_fails_loudly():
    model, tools = ScriptedModel("delete_file", {"path": "/x"}), Tools()
    agent = Agent(name="ops", model=model, tools=tools.gated())
    with pytest.raises(UserError, match="has no session_id") as caught:
        Runner.run_sync(agent, "clean up", context={"chat": "nothing useful"})
    assert isinstance(caught.value.__cause__, TypeError)
    assert tools.ran == []


# -- deferred: the run stops on interruptions, a person decides later, the state resumes ----


@pytest.mark.parametrize(
    ("decision", "ran", "received"),
    [
        ("allow", [("delete_file", "/srv/old")], "deleted /srv/old"),
        ("deny", [], DENIED_WITH_REASON),
    ],
)
def test_deferred_run_resumes_with_a_decision_made_while_nothing_waited(decision, ran, received):
    model, tools = ScriptedModel("delete_file", {"path": "/srv/old"}, call_id="call_9"), Tools()
    agent = Agent(name="ops", model=model, tools=tools.gated(defer=True))
    context = {"session_id": "chat-def"}
    first = Runner.run_sync(agent, "clean up", context=context)
    assert [i.raw_item.call_id for i in first.interruptions] == ["call_9"]
    row = Approval.objects.get(session_id="chat-def")
    assert (row.status, row.waiter, row.tool_call_id) == ("pending", "", "call_9")
    assert defer_interruptions(first, session_id="chat-def")["call_9"].pending  # idempotent
    assert get_listener().pending_slots() == 0
    assert abandon_orphans(lease_timeout=0) == 0  # no waiter: the sweep leaves it alone
    saved = first.to_state().to_string()

    assert gate.resolve_tool_decision(row.approval_id, decision, reason="not on a Friday")

    async def resume():
        state = await RunState.from_string(agent, saved)
        assert await aapply_decisions(state, session_id="chat-def") == []
        return await Runner.run(agent, state, context=context)

    second = asyncio.run(resume())
    assert tools.ran == ran
    assert model.received == [received]
    assert second.final_output == f"tool said: {received}"
    assert list(Approval.objects.values_list("approval_id", flat=True)) == [row.approval_id]


def test_native_needs_approval_maps_through_defer_interruptions():
    model, tools = ScriptedModel("delete_file", {"path": "/srv/a"}, call_id="c-7"), Tools()
    tool = function_tool(tools.functions()[0], needs_approval=True)
    agent = Agent(name="ops", model=model, tools=[tool])
    first = Runner.run_sync(agent, "clean up")
    verdicts = defer_interruptions(first.interruptions, session_id="chat-native")
    assert verdicts["c-7"].pending
    state = first.to_state()
    assert len(apply_decisions(state, session_id="chat-native")) == 1  # nobody answered yet
    assert gate.resolve_tool_decision(verdicts["c-7"].approval_id, "deny", reason="not on a Friday")
    assert apply_decisions(state, session_id="chat-native") == []
    Runner.run_sync(agent, state)
    assert tools.ran == []
    assert model.received == [DENIED_WITH_REASON]


def test_async_resume_waits_for_a_decision_made_later():
    model, tools = ScriptedModel("send_mail", {"to": "a@b.c", "subject": "s"}), Tools()
    agent = Agent(name="mailer", model=model, tools=tools.gated(defer=True))
    context = {"session_id": "chat-wait"}

    async def scenario():
        first = await Runner.run(agent, "mail", context=context)
        state = first.to_state()
        thread, box = decide_when_pending("chat-wait", "allow")
        assert await aapply_decisions(state, session_id="chat-wait", wait=True) == []
        thread.join(10)
        await Runner.run(agent, state, context=context)
        return box

    box = asyncio.run(scenario())
    assert box["won"] is True
    assert tools.ran == [("send_mail", "a@b.c")]
    assert model.received == ["sent to a@b.c"]


def test_an_approval_given_only_to_the_sdk_still_waits_for_toolgate():
    model, tools = ScriptedModel("delete_file", {"path": "/q"}), Tools()
    agent = Agent(name="ops", model=model, tools=tools.gated(defer=True, timeout=0.3))
    context = {"session_id": "chat-bypass"}
    first = Runner.run_sync(agent, "clean up", context=context)
    state = first.to_state()
    for item in state.get_interruptions():
        state.approve(item)  # not through toolgate: the row is still pending
    Runner.run_sync(agent, state, context=context)
    assert tools.ran == []
    assert model.received == [gate.EXPIRED_MESSAGE]


def test_the_example_runs_offline(child_env, python):
    out = subprocess.run(
        [python, "examples/openai_agents_gated.py", "--deferred"],
        cwd=str(Path(__file__).resolve().parent.parent),
        env=child_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "run interrupted: 1 call(s) awaiting approval" in out.stdout
    assert "[tool] deleting /srv/old-logs" in out.stdout
    assert "The tool said: deleted /srv/old-logs" in out.stdout


def test_approval_ids_are_stable_unguessable_and_per_session():
    a = approval_id_for("s1", "call_1", "shell")
    assert a == approval_id_for("s1", "call_1", "shell")
    assert a != approval_id_for("s2", "call_1", "shell")
    assert a != approval_id_for("s1", "call_2", "shell")
    assert len(a) == 32 and set(a) <= set(
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    )
    with override_settings(SECRET_KEY="another-secret-key-" + "x" * 40):
        assert approval_id_for("s1", "call_1", "shell") != a
    assert approval_id_for("s1", "", "shell") != approval_id_for("s1", "", "shell")


# -- issue 15: the documented deferred flow, reused call ids, edits ------------------------


def test_deferred_flow_with_a_user_instance_in_the_context_can_be_saved(django_user_model):
    alice = django_user_model.objects.create_user("alice")
    model, tools = ScriptedModel("delete_file", {"path": "/srv/u"}, call_id="call_u"), Tools()
    agent = Agent(name="ops", model=model, tools=tools.gated(defer=True))
    context = {"session_id": "chat-user", "user": alice}  # as docs/frameworks.md shows
    first = Runner.run_sync(agent, "clean up", context=context)
    saved = first.to_state().to_string()  # was: TypeError, User is not JSON serializable
    row = Approval.objects.get(session_id="chat-user")
    assert row.user_id == alice.pk
    assert gate.resolve_tool_decision(row.approval_id, "allow")

    async def resume():
        state = await RunState.from_string(agent, saved)
        assert await aapply_decisions(state, session_id="chat-user") == []
        return await Runner.run(agent, state)

    asyncio.run(resume())
    assert tools.ran == [("delete_file", "/srv/u")]
    assert Approval.objects.get(pk=row.pk).executed_at is not None


def test_a_reused_call_id_never_inherits_the_other_calls_answer():
    tools = Tools()
    context = {"session_id": "chat-reuse"}

    def turn(path: str):
        model = ScriptedModel("delete_file", {"path": path}, call_id="call_0")
        agent = Agent(name="ops", model=model, tools=tools.gated(defer=True))
        return agent, Runner.run_sync(agent, "clean up", context=context)

    agent_a, first = turn("/a")
    row_a = Approval.objects.get(session_id="chat-reuse")
    assert gate.resolve_tool_decision(row_a.approval_id, "deny")
    state_a = first.to_state()
    assert apply_decisions(state_a, session_id="chat-reuse") == []
    Runner.run_sync(agent_a, state_a, context=context)

    agent_b, second = turn("/b")
    row_b = Approval.objects.exclude(pk=row_a.pk).get(session_id="chat-reuse")
    assert (row_b.status, row_b.arguments) == ("pending", {"path": "/b"})
    state_b = second.to_state()
    # /b is still waiting for a person: it must not be rejected with /a's denial
    assert len(apply_decisions(state_b, session_id="chat-reuse")) == 1
    assert gate.resolve_tool_decision(row_b.approval_id, "allow")
    assert apply_decisions(state_b, session_id="chat-reuse") == []
    Runner.run_sync(agent_b, state_b, context=context)
    assert tools.ran == [("delete_file", "/b")]


def test_an_edited_call_runs_with_the_approved_arguments_and_is_marked_executed():
    model, tools = ScriptedModel("delete_file", {"path": "/srv/all"}), Tools()
    agent = Agent(name="ops", model=model, tools=tools.gated())

    def edit(row):
        assert row.editable and row.arguments_schema["properties"]["path"]["type"] == "string"
        assert row.description == "Delete a file."
        return decisions.decide(
            row.approval_id, "allowed", via="api", edited_arguments={"path": "/srv/old"}
        ).won

    thread, box = decide_when_pending("chat-edit", "allow", how=edit)
    Runner.run_sync(agent, "clean up", context={"session_id": "chat-edit"})
    thread.join(10)
    assert box["won"] is True
    assert tools.ran == [("delete_file", "/srv/old")]
    row = Approval.objects.get(session_id="chat-edit")
    assert (row.arguments, row.edited_arguments) == ({"path": "/srv/all"}, {"path": "/srv/old"})
    assert row.execution_ok is True and row.execution_summary == "deleted /srv/old"
    assert gate.mark_executed(row.approval_id) is False  # reported once


def test_a_deferred_edit_runs_the_edit_on_resume():
    model, tools = ScriptedModel("delete_file", {"path": "/srv/x"}, call_id="call_e"), Tools()
    agent = Agent(name="ops", model=model, tools=tools.gated(defer=True))
    context = {"session_id": "chat-dedit"}
    first = Runner.run_sync(agent, "clean up", context=context)
    row = Approval.objects.get(session_id="chat-dedit")
    decisions.decide(row.approval_id, "allowed", via="api", edited_arguments={"path": "/srv/y"})
    state = first.to_state()
    assert apply_decisions(state, session_id="chat-dedit") == []
    Runner.run_sync(agent, state, context=context)
    assert tools.ran == [("delete_file", "/srv/y")]
    assert Approval.objects.get(pk=row.pk).executed_at is not None


@pytest.mark.parametrize("example", ["openai_agents_gated.py", "pydantic_ai_gated.py"])
@pytest.mark.parametrize("deferred", [[], ["--deferred"]])
def test_the_examples_run_an_edited_call(child_env, python, example, deferred):
    out = subprocess.run(
        [python, f"examples/{example}", "--edit", '{"path": "/srv/old-logs/2024"}', *deferred],
        cwd=str(Path(__file__).resolve().parent.parent),
        env=child_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "edited to {'path': '/srv/old-logs/2024'}" in out.stdout
    assert "[tool] deleting /srv/old-logs/2024" in out.stdout
