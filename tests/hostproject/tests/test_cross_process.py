"""An agent in another process and a socket in this one, on the host's defaults.

No Redis, no SQLite tuning: the in-memory layer never leaves its process, so
the call reaches the socket, and the click reaches the agent, through each
process's database re-check (about a second each way).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from channels.testing import WebsocketCommunicator
from django.db import connection

from approvals.models import Approval

from .test_websocket import _application, _cookie_for

pytestmark = pytest.mark.django_db(transaction=True)

HOST = Path(__file__).resolve().parent.parent


def test_a_call_gated_in_another_process_is_decided_over_this_processs_socket(alice):
    database = str(Path(connection.settings_dict["NAME"]).resolve())
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HOST), os.environ.get("PYTHONPATH", "")]),
    }
    agent = subprocess.Popen(
        [sys.executable, str(HOST / "tests" / "agent_process.py"), database, alice.email, "x-run"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    communicator = WebsocketCommunicator(
        _application(),
        "/realtime/gate/approvals/?session_id=x-run",
        headers=[(b"origin", b"http://testserver"), (b"cookie", _cookie_for(alice))],
    )

    async def scenario() -> str:
        assert (await communicator.connect())[0]
        first = await communicator.receive_json_from(10)
        pending = first["pending"] if first["type"] == "snapshot" else []
        if not pending:
            start = await communicator.receive_json_from(20)
            assert start["type"] == "tool_start" and start["tool_name"] == "deploy"
            pending = [start]
        aid = pending[0]["approval_id"]
        await communicator.send_json_to(
            {"type": "tool_confirm", "approval_id": aid, "decision": "allow"}
        )
        while (reply := await communicator.receive_json_from(10))["type"] != "tool_confirm_result":
            pass
        assert reply["resolved"] is True, reply
        await communicator.disconnect()
        return aid

    try:
        started = time.monotonic()
        aid = asyncio.run(asyncio.wait_for(scenario(), 40))
        out, err = agent.communicate(timeout=20)
    finally:
        agent.kill()
    assert agent.returncode == 0, err
    assert out.splitlines() == [f"gated {aid}", "answer allow"], (out, err)
    assert time.monotonic() - started < 30
    assert Approval.objects.get(approval_id=aid).decided_via == "websocket"
