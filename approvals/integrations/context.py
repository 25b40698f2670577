"""Framework glue shared by the adapters: whose run a call belongs to, and its arguments."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from ..deferred import Target

__all__ = ["GateContext", "GateOptions", "jsonable"]


@runtime_checkable
class GateContext(Protocol):
    """Whose run this is: what an adapter reads from the framework's deps/context.

    Any object with these two attributes works (a dataclass, your deps class,
    a Django model); a mapping with ``"session_id"`` and ``"user"`` keys works
    too. ``user`` may be a user instance, a primary key, or ``None``.
    """

    session_id: str
    user: Any


@dataclass(frozen=True)
class GateOptions:
    """How an adapter finds the :class:`Target` of a call, and how long a call may wait.

    ``context(framework_ctx)`` wins when given; else a fixed ``session_id`` (with
    ``user``); else the run's deps/context object must look like :class:`GateContext`.
    """

    session_id: str | None = None
    user: Any = None
    context: Callable[[Any], Any] | None = None
    timeout: float | None = None

    def target(self, framework_ctx: Any, deps: Any) -> Target:
        """The session and user for a call made with ``framework_ctx`` and ``deps``."""
        if self.context is not None:
            return _as_target(self.context(framework_ctx), "the context callable's result")
        if self.session_id is not None:
            return Target(str(self.session_id), self.user)
        return _as_target(deps, "the run's deps/context")


def _as_target(source: Any, what: str) -> Target:
    if isinstance(source, Target):
        return source
    if isinstance(source, Mapping):
        session_id, user = source.get("session_id"), source.get("user")
    else:
        session_id = getattr(source, "session_id", None)
        user = getattr(source, "user", None)
    if session_id is None:
        raise TypeError(
            f"toolgate needs a session for this tool call, but {what} ({type(source).__name__}) "
            "has no session_id: give it session_id/user attributes (see GateContext), or pass "
            "session_id= or context= to the gated wrapper."
        )
    return Target(str(session_id), user)


def jsonable(arguments: Any) -> dict:
    """The call's arguments as a JSON-serialisable dict (validated models become plain data)."""
    try:
        json.dumps(arguments)
        data = arguments
    except (TypeError, ValueError):
        try:
            from pydantic_core import to_jsonable_python

            data = to_jsonable_python(arguments, fallback=str)
        except ImportError:  # pragma: no cover - both frameworks ship pydantic
            data = json.loads(json.dumps(arguments, default=str))
    return data if isinstance(data, dict) else {"input": data}
