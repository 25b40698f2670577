"""What the sync and the async client share: request bodies, answers, ids and backoff.

Nothing here does I/O, so both halves of `ToolgateClient` behave the same by construction.
"""

from __future__ import annotations

import json
import random
import secrets
import string
import time
from dataclasses import dataclass, field
from typing import Any

from .errors import ApprovalIdInUse, AuthenticationError, ToolgateError

__all__ = ["Backoff", "Decision", "new_approval_id"]

PENDING = "pending"
DEFAULT_DENIAL = "The user declined to run this tool call."
_ALNUM = string.ascii_letters + string.digits


def new_approval_id() -> str:
    """An unguessable, URL-safe approval id: 144 random bits, starting with a letter or digit.

    The first character is never ``-`` or ``_`` because spreadsheet programs read a leading
    ``-`` as a formula when an audit export is opened.
    """
    token = secrets.token_urlsafe(18)
    if token[0] not in _ALNUM:
        token = secrets.choice(_ALNUM) + token[1:]
    return token


@dataclass(frozen=True)
class Decision:
    """The outcome of a gated call, as an agent needs it.

    `arguments` is what to run: the person's edit when they changed the arguments, else the
    proposal. `message` is the text to feed the model when the call did not run (``None``
    when it is allowed). `approval` is the server's whole approval object.
    """

    approval_id: str
    status: str
    allowed: bool
    arguments: dict[str, Any]
    reason: str
    message: str | None
    decided_via: str = ""
    approval: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_approval(cls, approval: dict[str, Any]) -> Decision:
        status = str(approval.get("status") or "")
        allowed = status == "allowed"
        edited = approval.get("edited_arguments")
        arguments = edited if edited is not None else approval.get("arguments")
        message = approval.get("message")
        if not allowed and not message:
            message = DEFAULT_DENIAL
        return cls(
            approval_id=str(approval.get("approval_id") or ""),
            status=status,
            allowed=allowed,
            arguments=dict(arguments or {}),
            reason=str(approval.get("reason") or ""),
            message=None if allowed else message,
            decided_via=str(approval.get("decided_via") or ""),
            approval=approval,
        )


def create_body(
    session_id: str,
    tool_name: str,
    arguments: dict[str, Any] | None,
    *,
    approval_id: str,
    tool_call_id: str,
    timeout: float | None,
    description: str,
    editable: bool,
    arguments_schema: dict[str, Any] | None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "approval_id": approval_id,
        "session_id": session_id,
        "tool_name": tool_name,
        "arguments": arguments if arguments is not None else {},
        "tool_call_id": tool_call_id,
        "description": description,
        "editable": editable,
    }
    if timeout is not None:
        body["timeout"] = timeout
    if arguments_schema is not None:
        body["arguments_schema"] = arguments_schema
    return body


def is_retryable_status(status: int) -> bool:
    """5xx answers are worth retrying (a restarting server, a proxy in between); 4xx never."""
    return status >= 500


def read_answer(status: int, content: bytes) -> dict[str, Any]:
    """The JSON object of a 2xx answer, or the matching `ToolgateError` for a 4xx."""
    body = _json_or_none(content)
    if 200 <= status < 300:
        if not isinstance(body, dict):
            raise ToolgateError(
                f"toolgate answered {status} without a JSON object",
                status=status,
                code="bad_response",
            )
        return body
    raise error_for(status, body)


def error_for(status: int, body: Any) -> ToolgateError:
    code = ""
    detail = ""
    if isinstance(body, dict):
        code = str(body.get("error") or "")
        detail = str(body.get("detail") or "")
    code = code or f"http_{status}"
    text = f"toolgate answered {status} {code}" + (f": {detail}" if detail else "")
    cls: type[ToolgateError] = ToolgateError
    if status == 401:
        cls = AuthenticationError
    elif status == 409 and code == "approval_id_in_use":
        cls = ApprovalIdInUse
    return cls(text, status=status, code=code, detail=detail, body=body)


def _json_or_none(content: bytes) -> Any:
    try:
        return json.loads(content) if content else None
    except ValueError:
        return None


class Backoff:
    """Exponential backoff with jitter (each pause between half and all of the current step),
    reset by any answer from the server.

    `retry_for` bounds how long the server may stay unreachable (or answer 5xx) in a row;
    ``None`` retries forever.
    """

    def __init__(self, *, initial: float, maximum: float, retry_for: float | None) -> None:
        self.initial = initial
        self.maximum = maximum
        self.retry_for = retry_for
        self.attempt = 0
        self.failing_since: float | None = None

    def reset(self) -> None:
        self.attempt = 0
        self.failing_since = None

    def next_delay(self, failure: str) -> float:
        """The pause before the next attempt; raises once the server was gone for too long."""
        now = time.monotonic()
        if self.failing_since is None:
            self.failing_since = now
        elif self.retry_for is not None and now - self.failing_since > self.retry_for:
            raise ToolgateError(
                f"toolgate unreachable for {now - self.failing_since:.0f} s: {failure}",
                code="unreachable",
                detail=failure,
            )
        ceiling = min(self.maximum, self.initial * (2**self.attempt))
        self.attempt += 1
        return random.uniform(ceiling / 2, ceiling)
