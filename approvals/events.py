"""The shapes of what the app tells clients and other processes.

Events are plain dicts. Keys starting with ``_`` are internal (who may see
the event, where it came from) and are stripped before a client sees them.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

PENDING_FIELDS = (
    "approval_id",
    "session_id",
    "tool_name",
    "tool_call_id",
    "arguments",
    "created_at",
    "expires_at",
    "description",
    "editable",
    "arguments_schema",
    "agent_key__name",
)


def iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def pending_item(approval: Any) -> dict:
    """An approval as listed in ``tool-approvals``, the snapshot and ``tool_start``."""
    get = approval.get if isinstance(approval, dict) else lambda k: getattr(approval, k)
    item = {name: get(name) for name in PENDING_FIELDS if name != "agent_key__name"}
    agent = agent_name(approval)
    if agent is not None:  # carried only for calls gated with an agent key
        item["agent"] = agent
    item["created_at"] = iso(item["created_at"])
    item["expires_at"] = iso(item["expires_at"])
    if item["arguments_schema"] is None:  # carried only when the call has one
        del item["arguments_schema"]
    # Whose call it is (a username), for a viewer who decides for others; null when unknown.
    item["user"] = (
        approval.get("owner") if isinstance(approval, dict) else getattr(approval, "owner", None)
    )
    return item


def agent_name(approval: Any) -> str | None:
    """The name of the agent key a call was gated with (``None``: not over the agent API)."""
    if isinstance(approval, dict):
        return approval.get("agent_key__name")
    return approval.agent_key.name if approval.agent_key_id is not None else None


def tool_start(approval: Any) -> dict:
    """The event sent when a call is gated (not awaiting confirmation when a rule answered)."""
    get = approval.get if isinstance(approval, dict) else lambda k: getattr(approval, k)
    event = {"type": "tool_start", **pending_item(approval)}
    event["awaiting_confirmation"] = get("status") == "pending"
    event["_user_id"] = get("user_id")
    return event


def tool_decision(
    row: dict, status: str, via: str, by: Any, reason: str, edited_arguments: Any = None
) -> dict:
    """The event sent once a call is decided (``edited_arguments``: a person's edit, or null)."""
    return {
        "type": "tool_decision",
        "approval_id": row["approval_id"],
        "session_id": row["session_id"],
        "status": status,
        "decided_via": via,
        "decided_by": display_user(by),
        "reason": reason,
        "edited_arguments": edited_arguments,
        "_user_id": row["user_id"],
    }


def display_user(user: Any) -> str | None:
    if user is None or not hasattr(user, "get_username"):
        return None if user is None else str(user)
    return user.get_username()


def with_preview(item: dict, limit: int) -> dict:
    """``item`` as a socket carries it: ``arguments`` over ``limit`` bytes of compact JSON
    become the first ``limit`` bytes of that text, with ``"arguments_truncated": true``.

    A socket frame has a size limit in the server (1 MiB in daphne); the full
    arguments are one HTTP request away (``tool-approvals/<approval_id>``).
    """
    if "arguments" not in item:
        return item
    text = json.dumps(item["arguments"], separators=(",", ":"), ensure_ascii=False)
    encoded = text.encode("utf-8", "surrogatepass")
    if len(encoded) <= limit:
        return item
    return {
        **item,
        "arguments": encoded[:limit].decode("utf-8", "ignore"),
        "arguments_truncated": True,
    }


def public(event: dict) -> dict:
    """The event as a client sees it."""
    return {k: v for k, v in event.items() if not k.startswith("_")}
