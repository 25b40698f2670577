"""What a notification says: links to a call's page, webhook bodies (json, Slack), emails.

Bodies are built once, when the delivery is written, and stored; the worker
sends exactly the stored text, signed with :func:`sign`.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

from django.urls import NoReverseMatch, reverse

from .agentapi.objects import approval_object
from .conf import setting
from .models import Approval

_TITLES = {
    "approval.requested": "wants to run",
    "approval.expiring": "is still waiting to run",
    "approval.decided": "was decided:",
    "ping": "test from toolgate for",
}


def absolute(path: str) -> str:
    """``path`` made absolute with ``SITE_URL`` (left a path when it is not set)."""
    base = setting("SITE_URL")
    return f"{str(base).rstrip('/')}{path}" if base else path


def links(approval_id: str) -> dict[str, str]:
    """The call's page and the inbox, absolute when ``SITE_URL`` is set."""
    try:
        review = reverse("approvals_page:review", args=[approval_id])
        inbox = reverse("approvals_page:inbox")
    except NoReverseMatch:  # the host did not mount the pages
        return {"review": "", "inbox": ""}
    return {"review": absolute(review), "inbox": absolute(inbox)}


def sign(secret: str, body: bytes) -> str:
    """``sha256=<hex HMAC-SHA256 of body keyed by secret>``: the signature header's value."""
    digest = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return f"sha256={digest}"


def summary(event: str, approval: Approval) -> str:
    """One line for a person: who, which tool, what happened."""
    who = approval.session_id or "an agent"
    tool = approval.tool_name or "a tool"
    if event == "approval.decided":
        return f"{tool} ({who}) was decided: {approval.status}"
    return f"Agent {who} {_TITLES.get(event, 'wants to run')} {tool}"


def json_body(event: str, delivery_id: str, approval: Approval) -> str:
    """The ``json`` format: event, delivery id, the approval object, links."""
    data = {
        "event": event,
        "delivery": delivery_id,
        "approval": approval_object(approval),
        "links": links(approval.approval_id),
    }
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


def slack_body(event: str, delivery_id: str, approval: Approval) -> str:
    """The ``slack`` format: an incoming-webhook message with the review link as a button."""
    review = links(approval.approval_id)["review"]
    text = summary(event, approval)
    args = json.dumps(approval.arguments, ensure_ascii=False, indent=1)
    if len(args) > 2500:
        args = args[:2500] + "…"
    blocks: list[dict[str, Any]] = [
        {"type": "section", "text": {"type": "mrkdwn", "text": f"*{_escape(text)}*"}},
        {"type": "section", "text": {"type": "mrkdwn", "text": f"```{_escape(args)}```"}},
    ]
    if approval.description:
        context = {"type": "mrkdwn", "text": _escape(approval.description[:2000])}
        blocks.insert(1, {"type": "context", "elements": [context]})
    if review:
        button = {
            "type": "button",
            "text": {"type": "plain_text", "text": "Review"},
            "url": review,
            "action_id": "review",
        }
        if event != "approval.decided":
            button["style"] = "primary"
        blocks.append({"type": "actions", "elements": [button]})
    data = {"text": f"{text}: {review}" if review else text, "blocks": blocks}
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


def webhook_body(fmt: str, event: str, delivery_id: str, approval: Approval) -> str:
    build = slack_body if fmt == "slack" else json_body
    return build(event, delivery_id, approval)


def email_body(event: str, approval: Approval) -> str:
    """An email as stored in the outbox: JSON with ``subject`` and ``message``."""
    review = links(approval.approval_id)["review"]
    line = summary(event, approval)
    lines = [line + ".", ""]
    if approval.description:
        lines += [approval.description, ""]
    lines += [
        "Arguments:",
        json.dumps(approval.arguments, ensure_ascii=False, indent=2),
        "",
        f"Allow or deny it here: {review}",
        f"It expires at {approval.expires_at:%Y-%m-%d %H:%M:%S %Z}.",
    ]
    subject = f"[toolgate] {line}"[:200]
    return json.dumps({"subject": subject, "message": "\n".join(lines)}, ensure_ascii=False)


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
