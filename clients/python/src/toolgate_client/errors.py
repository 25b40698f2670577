"""The exceptions the client raises."""

from __future__ import annotations

from typing import Any

__all__ = ["ApprovalIdInUse", "AuthenticationError", "ToolgateError"]


class ToolgateError(Exception):
    """A request to toolgate failed in a way that retrying the same request will not fix.

    `status` is the HTTP status (``None`` when the server was never reached), `code` the
    server's error code (``"not_found"``, ``"invalid_key"``, ...) or a client-side one
    (``"unreachable"``, ``"bad_response"``), `detail` a human sentence when there is one.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        code: str = "",
        detail: str = "",
        body: Any = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.detail = detail
        self.body = body


class AuthenticationError(ToolgateError):
    """401: no key was sent (`authentication_required`) or the key is wrong or revoked
    (`invalid_key`)."""


class ApprovalIdInUse(ToolgateError):
    """409 `approval_id_in_use`: the approval_id belongs to another user or session."""
