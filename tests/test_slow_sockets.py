"""A client that stops reading is closed (4408) by a real daphne, not buffered without end.

The sockets connect, read their snapshot and never read again, with a tiny
receive buffer. Calls keep coming; daphne's unsent bytes for each socket grow
until ``SOCKET_BACKLOG_BYTES``, and the socket is closed with 4408. The queue
limit is set out of reach, so only the unsent-bytes probe (``_compat``) can
close them: if daphne or Twisted change what it reads, this fails.
"""

from __future__ import annotations

import json

import pytest
from django.test import Client

from approvals import gate
from approvals.hub import CLOSE_TOO_SLOW
from approvals.listener import get_listener

from .procs import start_daphne, wait_ready
from .rawws import DROPPED, close_code, open_socket, read_frame

pytestmark = pytest.mark.django_db(transaction=True)
BOUNDS = {"SOCKET_QUEUE_LIMIT": 1_000_000, "SOCKET_BACKLOG_BYTES": 256 * 1024}


def test_sockets_that_never_read_are_closed_with_4408(child_env, django_user_model, tmp_path):
    user = django_user_model.objects.create_user("slow")
    client = Client()
    client.force_login(user)
    sessionid = client.cookies["sessionid"].value
    log = (tmp_path / "daphne.log").open("w+")
    server = wait_ready(start_daphne(child_env, approvals=BOUNDS, stderr=log))
    sockets = []
    try:
        for _ in range(3):
            sock = open_socket(server.port, server.origin, sessionid)
            opcode, payload = read_frame(sock)
            assert opcode == 0x1 and json.loads(payload)["type"] == "snapshot"
            sockets.append(sock)
        listener = get_listener()
        for _ in range(400):  # 8 MB of events for each socket, far beyond the bound
            slot = gate.begin_tool_decision(
                "s", gate.new_approval_id(), user=user, arguments={"blob": "x" * 20_000}
            )
            listener.unregister(slot)
        codes = [close_code(sock, timeout=60) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()
        server.stop()
    # A client that reads nothing cannot read the close frame either: after a second
    # without its answer, autobahn drops the connection. Either way the server let go,
    # having closed with 4408 (it logs which close it was).
    log.seek(0)
    text = log.read()
    assert text.count("closing a socket whose client stopped reading") >= 3, (codes, text[-2000:])
    assert all(code in (CLOSE_TOO_SLOW, DROPPED) for code in codes), codes
