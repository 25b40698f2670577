"""The client error protocol: stable codes, a sentence for each, and the error that carries them.

HTTP answers, WebSocket replies and the rule logic all speak these codes, so a
client handles one vocabulary. This module imports nothing else of the app.
"""

from __future__ import annotations

INVALID_JSON = "invalid_json"
MISSING_FIELD = "missing_field"
INVALID_FIELD = "invalid_field"
INVALID_DECISION = "invalid_decision"
TOO_LARGE = "too_large"
AUTHENTICATION_REQUIRED = "authentication_required"
NOT_FOUND = "not_found"
ALREADY_DECIDED = "already_decided"
UNKNOWN_TYPE = "unknown_type"
METHOD_NOT_ALLOWED = "method_not_allowed"
CSRF_FAILED = "csrf_failed"
DATABASE_UNAVAILABLE = "database_unavailable"
INVALID_KEY = "invalid_key"
APPROVAL_ID_IN_USE = "approval_id_in_use"
NOT_ALLOWED = "not_allowed"
ALREADY_EXECUTED = "already_executed"
NOT_EDITABLE = "not_editable"
INVALID_ARGUMENTS = "invalid_arguments"

#: The sentence sent with a code when the raiser gave none more precise.
DETAILS = {
    AUTHENTICATION_REQUIRED: "Sign in to see or decide tool calls.",
    NOT_FOUND: "No pending tool call with that approval_id is visible to you.",
    ALREADY_DECIDED: "That tool call was already decided; the first decision stands.",
    METHOD_NOT_ALLOWED: "This endpoint accepts only POST.",
    CSRF_FAILED: "The CSRF check failed: send the csrftoken cookie's value in X-CSRFToken.",
    DATABASE_UNAVAILABLE: "The database could not be reached, so nothing was decided. Try again.",
    INVALID_KEY: "The agent key is wrong or was revoked.",
    APPROVAL_ID_IN_USE: "That approval_id is already used by another user or session.",
    NOT_ALLOWED: "That tool call was not allowed, so it cannot have run.",
    ALREADY_EXECUTED: "That tool call was reported executed already; a call runs once.",
    NOT_EDITABLE: "This tool call was gated without editable=True: allow or deny it as proposed.",
    INVALID_ARGUMENTS: "The edited arguments do not satisfy the call's arguments_schema.",
}


def detail_for(code: str) -> str:
    """The default sentence for ``code``."""
    return DETAILS.get(code, "The request failed.")


class RequestError(ValueError):
    """A client mistake: ``code`` is stable, ``detail`` is for a person.

    A ``ValueError``, so code that calls the app from Python can catch it as one.
    """

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail
