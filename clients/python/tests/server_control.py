"""The Django side of the client tests, run with the server's interpreter (not the tests').

``python server_control.py`` reads JSON lines on stdin and answers one JSON line
each on stdout, against the same database as the daphne under test:

- ``{"op": "user", "username": ...}``: the user (created if new); ``{"id"}``.
- ``{"op": "session", "username": ...}``: a signed-in session for that user;
  ``{"sessionid"}`` (the cookie the tests send to ``tool-confirm``).
- ``{"op": "key", "username": ..., "name": ...}``: a new agent key; ``{"key"}``.
- ``{"op": "revoke", "name": ...}``: revoke a key; ``{"revoked": bool}``.
- ``{"op": "calls"}``: every gated call, oldest first; ``{"calls": [...]}``.
- ``{"op": "reset"}``: delete every call (between tests).

The tests themselves never import Django: this process is their window on the
server's database.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def _row(row: Any) -> dict[str, Any]:
    def iso(value: Any) -> str | None:
        return value.isoformat() if value else None

    return {
        "approval_id": row.approval_id,
        "user": row.user.get_username() if row.user_id else None,
        "agent_key": row.agent_key.name if row.agent_key_id else None,
        "session_id": row.session_id,
        "tool_name": row.tool_name,
        "tool_call_id": row.tool_call_id,
        "arguments": row.arguments,
        "description": row.description,
        "editable": row.editable,
        "arguments_schema": row.arguments_schema,
        "status": row.status,
        "decided_via": row.decided_via,
        "reason": row.reason,
        "executed_at": iso(row.executed_at),
        "execution_ok": row.execution_ok,
        "execution_summary": row.execution_summary,
    }


def handle(command: dict[str, Any]) -> dict[str, Any]:
    from django.conf import settings
    from django.contrib.auth import (
        BACKEND_SESSION_KEY,
        HASH_SESSION_KEY,
        SESSION_KEY,
        get_user_model,
    )
    from django.utils.module_loading import import_string

    from approvals import agentkeys
    from approvals.models import Approval

    op = command["op"]
    User = get_user_model()
    if op == "user":
        user, _ = User.objects.get_or_create(username=command["username"])
        return {"id": user.pk}
    if op == "session":
        user = User.objects.get(username=command["username"])
        session = import_string(f"{settings.SESSION_ENGINE}.SessionStore")()
        session[SESSION_KEY] = str(user.pk)
        session[BACKEND_SESSION_KEY] = settings.AUTHENTICATION_BACKENDS[0]
        session[HASH_SESSION_KEY] = user.get_session_auth_hash()
        session.create()
        return {"sessionid": session.session_key}
    if op == "key":
        user, _ = User.objects.get_or_create(username=command["username"])
        return {"key": agentkeys.create_key(user, command["name"])[1]}
    if op == "revoke":
        return {"revoked": bool(agentkeys.revoke_key(command["name"]))}
    if op == "calls":
        rows = Approval.objects.select_related("user", "agent_key").order_by("pk")
        return {"calls": [_row(r) for r in rows]}
    if op == "reset":
        Approval.objects.all().delete()
        return {"ok": True}
    return {"error": f"unknown op {op!r}"}


def main() -> None:
    import django

    django.setup()
    from django.db import close_old_connections

    print(json.dumps({"ready": True}), flush=True)
    for raw in sys.stdin:
        try:
            answer = handle(json.loads(raw))
        except Exception as exc:  # the test reads it as a failure
            answer = {"error": repr(exc)}
        finally:
            close_old_connections()
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
