"""The sync client against a real daphne of this project (realserver.py)."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest
from realserver import DENIED, ToolgateServer
from toolgate_client import (
    ApprovalIdInUse,
    AuthenticationError,
    Decision,
    ToolgateClient,
    ToolgateError,
    new_approval_id,
)


def in_background(fn: Callable[[], Decision]) -> Future[Decision]:
    pool = ThreadPoolExecutor(1)
    future = pool.submit(fn)
    pool.shutdown(wait=False)
    return future


def ask(client: ToolgateClient, **kwargs: Any) -> Future[Decision]:
    params: dict[str, Any] = {"arguments": {"path": "/tmp/x"}} | kwargs
    return in_background(lambda: client.request_tool_decision("s1", "write_file", **params))


def test_new_approval_id_is_url_safe_and_unguessable() -> None:
    ids = {new_approval_id() for _ in range(2000)}
    assert len(ids) == 2000
    for approval_id in ids:
        assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]{23}", approval_id)


def test_allowed(client: ToolgateClient, server: ToolgateServer) -> None:
    future = ask(client, tool_call_id="tc1", description="why", timeout=60)
    call = server.wait_for_pending()[0]
    assert (call.tool_name, call.session_id, call.tool_call_id) == ("write_file", "s1", "tc1")
    assert call.arguments == {"path": "/tmp/x"} and call.description == "why"
    assert server.decide(call.approval_id, "allow")
    decision = future.result(10)
    assert decision.allowed and decision.status == "allowed"
    assert decision.arguments == {"path": "/tmp/x"}
    assert decision.message is None and decision.approval_id == call.approval_id
    assert server.count("POST", "/approvals") == 1


def test_denied_carries_reason_and_message(client: ToolgateClient, server: ToolgateServer) -> None:
    future = ask(client)
    call = server.wait_for_pending()[0]
    server.decide(call.approval_id, "deny", reason="not today")
    decision = future.result(10)
    assert not decision.allowed and decision.status == "denied"
    assert decision.reason == "not today"
    assert decision.message == f"{DENIED} Reason: not today"


def test_edited_arguments_are_what_to_run(client: ToolgateClient, server: ToolgateServer) -> None:
    schema = {"type": "object", "properties": {"path": {"type": "string"}}}
    future = ask(client, editable=True, arguments_schema=schema)
    call = server.wait_for_pending()[0]
    assert call.editable and call.arguments_schema == schema
    assert server.decide(call.approval_id, "allow", arguments={"path": "/tmp/safe"})
    decision = future.result(10)
    assert decision.allowed and decision.arguments == {"path": "/tmp/safe"}


def test_long_poll_loops_past_wait(client: ToolgateClient, server: ToolgateServer) -> None:
    future = ask(client)
    call = server.wait_for_pending()[0]
    time.sleep(2.5)  # wait=1: at least two long-polls ran out and were repeated
    assert not future.done()
    assert server.count("GET") >= 2
    server.decide(call.approval_id, "allow")
    assert future.result(10).allowed


def test_expired(server: ToolgateServer) -> None:
    with ToolgateClient(server.url, server.keys["alice"], wait=5.0) as tg:
        decision = tg.request_tool_decision("s1", "t", timeout=0.5)
    assert decision.status == "expired" and not decision.allowed and decision.message


def test_wait_is_sent_as_an_integer_when_whole(server: ToolgateServer) -> None:
    with ToolgateClient(server.url, server.keys["alice"], wait=2.0) as tg:
        tg.request_tool_decision("s1", "t", timeout=0.3)
    assert server.queries and set(server.queries) == {"wait=2"}


def test_given_approval_id_is_used(client: ToolgateClient, server: ToolgateServer) -> None:
    future = ask(client, approval_id="my-own-approval-id-123")
    call = server.wait_for_pending()[0]
    assert call.approval_id == "my-own-approval-id-123"
    server.decide(call.approval_id, "allow")
    assert future.result(10).approval_id == "my-own-approval-id-123"


def test_5xx_on_post_and_get_retried_with_same_id(
    client: ToolgateClient, server: ToolgateServer
) -> None:
    server.fail_next(2, 503, "/approvals")
    future = ask(client)
    call = server.wait_for_pending()[0]
    server.fail_next(2, 502, call.approval_id)
    time.sleep(0.5)
    server.decide(call.approval_id, "allow")
    assert future.result(10).allowed
    assert len(server.calls) == 1
    posts = [r for r in server.requests if r[0] == "POST"]
    assert [status for *_, status in posts] == [503, 503, 0]


def test_retried_post_that_landed_is_the_same_call(
    client: ToolgateClient, server: ToolgateServer
) -> None:
    approval_id = new_approval_id()
    first = ask(client, approval_id=approval_id)
    server.wait_for_pending()
    # The same POST again, as after a lost answer: 200 and the same call, not a second one.
    second = ask(client, approval_id=approval_id)
    time.sleep(0.3)
    assert len(server.calls) == 1
    server.decide(approval_id, "deny")
    assert first.result(10).status == second.result(10).status == "denied"


def test_network_error_before_the_server_is_up(server: ToolgateServer) -> None:
    server.stop()
    with ToolgateClient(
        server.url, server.keys["alice"], wait=1, initial_backoff=0.05, max_backoff=0.2
    ) as tg:
        future = in_background(lambda: tg.request_tool_decision("s1", "t"))
        time.sleep(0.6)  # connection refused, retried
        server.start()
        call = server.wait_for_pending()[0]
        server.decide(call.approval_id, "allow")
        assert future.result(10).allowed
    assert len(server.calls) == 1


def test_server_restart_mid_wait(client: ToolgateClient, server: ToolgateServer) -> None:
    future = ask(client)
    call = server.wait_for_pending()[0]
    # The row is pending before the POST's answer is back: wait for the long-poll,
    # or the restart may drop the POST instead and its retry get the decision.
    deadline = time.monotonic() + 10
    while not server.count("GET") and time.monotonic() < deadline:
        time.sleep(0.02)
    gets_before = server.count("GET")
    assert gets_before == 1
    server.stop()  # drops the held long-poll
    time.sleep(0.5)
    assert not future.done()
    server.start()
    server.decide(call.approval_id, "allow")
    decision = future.result(10)
    assert decision.allowed and decision.approval_id == call.approval_id
    # One call, whatever was sent again: the restart can catch the first POST before
    # its answer arrived, and the retry carries the same approval_id.
    assert len(server.calls) == 1
    assert server.count("GET") > gets_before


def test_unreachable_for_too_long_raises(server: ToolgateServer) -> None:
    server.stop()
    tg = ToolgateClient(server.url, "k", initial_backoff=0.05, max_backoff=0.1, retry_for=0.5)
    with pytest.raises(ToolgateError) as info:
        tg.request_tool_decision("s1", "t")
    assert info.value.code == "unreachable" and info.value.status is None


@pytest.mark.parametrize(
    ("key", "code"), [("", "authentication_required"), ("nope", "invalid_key")]
)
def test_401_is_authentication_error(server: ToolgateServer, key: str, code: str) -> None:
    with ToolgateClient(server.url, key) as tg, pytest.raises(AuthenticationError) as info:
        tg.request_tool_decision("s1", "t")
    assert info.value.status == 401 and info.value.code == code
    assert server.count("POST") == 1  # never retried


def test_409_approval_id_in_use(client: ToolgateClient, server: ToolgateServer) -> None:
    approval_id = new_approval_id()
    future = ask(client, approval_id=approval_id)
    server.wait_for_pending()
    with (
        ToolgateClient(server.url, server.keys["bob"]) as bob,
        pytest.raises(ApprovalIdInUse) as info,
    ):
        bob.request_tool_decision("s1", "t", approval_id=approval_id)
    assert info.value.status == 409 and info.value.code == "approval_id_in_use"
    with pytest.raises(ApprovalIdInUse):
        client.request_tool_decision("another-session", "t", approval_id=approval_id)
    server.decide(approval_id, "deny")
    future.result(10)


def test_other_4xx_raise_without_retry(client: ToolgateClient, server: ToolgateServer) -> None:
    with pytest.raises(ToolgateError) as info:
        client.request_tool_decision("", "t")
    assert info.value.status == 400 and info.value.code == "invalid_field"
    assert info.value.detail and server.count("POST") == 1
    with pytest.raises(ToolgateError) as info:
        client.cancel("no-such-approval-id-0000")
    assert info.value.status == 404 and info.value.code == "not_found"


def test_cancel(client: ToolgateClient, server: ToolgateServer) -> None:
    approval_id = new_approval_id()
    future = ask(client, approval_id=approval_id)
    server.wait_for_pending()
    assert client.cancel(approval_id) is True
    decision = future.result(10)
    assert decision.status == "cancelled" and not decision.allowed and decision.message
    assert client.cancel(approval_id) is False  # 409 already_decided


def test_mark_executed(client: ToolgateClient, server: ToolgateServer) -> None:
    future = ask(client)
    call = server.wait_for_pending()[0]
    server.decide(call.approval_id, "allow")
    decision = future.result(10)
    assert client.mark_executed(decision.approval_id, ok=False, summary="disk full") is True
    row = server.calls[call.approval_id]
    assert row.execution_ok is False and row.execution_summary == "disk full"
    assert client.mark_executed(decision.approval_id) is False  # a call runs once


def test_mark_executed_retried_after_lost_answer(
    client: ToolgateClient, server: ToolgateServer
) -> None:
    future = ask(client)
    call = server.wait_for_pending()[0]
    server.decide(call.approval_id, "allow")
    future.result(10)
    server.fail_next(1, 500, "/executed")
    assert client.mark_executed(call.approval_id) is True
    assert server.count("POST", "/executed") == 2


def test_mark_executed_not_allowed(client: ToolgateClient, server: ToolgateServer) -> None:
    future = ask(client)
    call = server.wait_for_pending()[0]
    server.decide(call.approval_id, "deny")
    future.result(10)
    assert client.mark_executed(call.approval_id) is False


def test_keyboard_interrupt_cancels_the_pending_call(server: ToolgateServer) -> None:
    tg = ToolgateClient(server.url, server.keys["alice"], wait=5)
    approval_id = new_approval_id()
    main = threading.main_thread()
    assert threading.current_thread() is main

    def interrupt() -> None:
        server.wait_for_pending()
        import _thread

        _thread.interrupt_main()

    threading.Thread(target=interrupt, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        tg.request_tool_decision("s1", "t", approval_id=approval_id)
    assert server.calls[approval_id].status == "cancelled"
    tg.close()


def test_revoked_key_is_authentication_error(server: ToolgateServer) -> None:
    name = f"short-lived-{new_approval_id()[:8]}"
    key = server.new_key(name)
    with ToolgateClient(server.url, key, wait=1) as tg:
        future = in_background(lambda: tg.request_tool_decision("s1", "t"))
        call = server.wait_for_pending()[0]
        assert call.agent_key == name and call.user == "alice"
        server.revoke(name)  # manage.py approvals_agent_key revoke
        with pytest.raises(AuthenticationError) as info:
            future.result(30)  # the next long-poll is refused
        assert info.value.status == 401 and info.value.code == "invalid_key"
        with pytest.raises(AuthenticationError):
            tg.request_tool_decision("s1", "t")
