"""Standing rules: which calls are answered without asking anyone.

Rules are cached per process as a :class:`~approvals.ruleindex.RuleIndex`
(exact tool names as dictionary keys with user and session; ``*`` patterns
compiled once and filed by their literal prefix), so matching a call costs a
few dictionary look-ups however many rules the table holds. A change made in
this process (admin, ``remember``) drops the cache at once and tells the other
processes over the channel layer; every process also asks the database at most
once per ``RULES_CACHE_SECONDS`` whether anything changed, so a change takes
effect everywhere within about a second even without a cross-process channel
layer.

Matching, in full (see ``docs/rules.md``):

* ``user`` empty applies to every user; ``session_id`` empty to every session;
* ``tool_name`` and every ``arguments_match`` value are patterns: ``*`` matches
  any run of characters (including none), everything else is literal and
  case-sensitive;
* an argument value that is not a string is compared by its compact JSON text
  (``1``, ``true``, ``null``, ``["a","b"]``, ``{"k":1}`` with sorted keys); a
  key the call's arguments lack never matches;
* an expired rule is ignored; any matching ``deny`` beats every ``allow``; the
  oldest matching rule of the winning kind answers.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import Count, Max
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver
from django.utils import timezone

from . import listener
from .conf import setting
from .errors import INVALID_FIELD, RequestError
from .models import REMEMBER_SCOPES, Answer, Rule, Status
from .permissions import may_decide_any
from .ruleindex import CachedRule, RuleIndex, as_text, compile_pattern, compile_rule, matches

__all__ = [
    "CachedRule",
    "RuleIndex",
    "as_text",
    "clean_arguments_match",
    "compile_pattern",
    "compile_rule",
    "describe",
    "invalidate",
    "match",
    "matches",
    "remember",
]


class _Cache:
    """This process's rule index and when it last asked the database for changes."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.index: RuleIndex | None = None
        self.version: tuple | None = None
        self.checked = 0.0
        self.generation = 0

    def get(self) -> RuleIndex:
        index = self.index
        if index is not None and self._fresh():
            return index
        if index is not None and not self.lock.acquire(blocking=False):
            return index  # another thread is checking; the current rules are fine meanwhile
        if index is None:
            self.lock.acquire()
        try:
            if self.index is not None and self._fresh():
                return self.index
            return self._refresh()
        finally:
            self.lock.release()

    def _fresh(self) -> bool:
        return time.monotonic() - self.checked < setting("RULES_CACHE_SECONDS")

    def _refresh(self) -> RuleIndex:
        generation = self.generation
        started = time.monotonic()
        version = _version()
        index = self.index
        if index is None or version != self.version:
            index = _load()
        if generation == self.generation:  # nobody invalidated while we read
            self.index, self.version, self.checked = index, version, started
        return index

    def clear(self) -> None:
        self.generation += 1
        self.index = None
        self.version = None


_cache = _Cache()


def _version() -> tuple:
    agg = Rule.objects.order_by().aggregate(n=Count("pk"), m=Max("updated_at"), k=Max("pk"))
    return (agg["n"], agg["m"], agg["k"])


def _load() -> RuleIndex:
    rows = (
        Rule.objects.live()
        .order_by("pk")
        .values(
            "pk",
            "user_id",
            "session_id",
            "tool_name",
            "arguments_match",
            "decision",
            "expires_at",
            "note",
            "literal",
        )
    )
    cached = (compile_rule(row) for row in rows)
    return RuleIndex(rule for rule in cached if rule is not None)


def _normal_user_id(user_id: Any) -> Any:
    if user_id is None or type(user_id) is int:
        return user_id
    from django.contrib.auth import get_user_model  # the user model is known only once apps load

    try:
        return get_user_model()._meta.pk.to_python(user_id)
    except (ValidationError, TypeError, ValueError):
        return user_id


# -- the public API ---------------------------------------------------------


def match(user_id: Any, session_id: str, tool_name: str, arguments: Any) -> CachedRule | None:
    """The rule that answers this call, or ``None`` (ask a person).

    Any matching, unexpired ``deny`` rule beats every ``allow`` rule; among
    rules of the winning kind the oldest answers. Uses this process's cache,
    which asks the database for changes at most once per
    ``RULES_CACHE_SECONDS``.
    """
    index = _cache.get()
    if not index.size:
        return None
    return index.match(
        _normal_user_id(user_id), session_id or "", tool_name, arguments, timezone.now()
    )


def describe(rule: CachedRule | Rule) -> str:
    """The reason recorded on a call a rule answered (fed to the model on deny).

    It names the rule and, when the rule has a note, ends with the note, so a
    deny rule's note tells the agent's model why.
    """
    verb = "Allowed" if rule.decision == Answer.ALLOW else "Denied"
    text = f"{verb} by rule #{rule.pk} ({rule.tool_name})"
    return f"{text}: {rule.note}" if rule.note else text


def remember(row: dict, status: str, scope: str, by: Any, reason: str = "") -> Rule:
    """Store the rule a person asked for with their decision (inside its transaction).

    The rule is for the call's user (the person whose agent made the call),
    whoever decided it; ``created_by`` is the decider. ``"session"`` covers
    this session and this tool, ``"always"`` every session and this tool. A
    user without ``approvals.decide_approval`` may only remember decisions on
    their own calls (``PermissionDenied``), and ``"session"`` needs a call that
    has a session (``RequestError``, a ``ValueError`` with the code
    ``invalid_field``); either rolls the decision back. An
    identical remembered rule is reused rather than duplicated.
    """
    if scope not in REMEMBER_SCOPES:
        raise ValueError(f'remember must be "session" or "always", not {scope!r}')
    if scope == "session" and not row["session_id"]:
        raise RequestError(
            INVALID_FIELD,
            'This call has no session, so "remember": "session" cannot apply; use "always".',
        )
    owner = row["user_id"]
    by_id = getattr(by, "pk", by)
    if hasattr(by, "has_perm") and owner != by_id and not may_decide_any(by):
        raise PermissionDenied("only the call's user or a decider may remember this decision")
    fields = {
        "user_id": owner,
        "session_id": row["session_id"] if scope == "session" else "",
        "tool_name": row["tool_name"],
        "decision": Answer.ALLOW if status == Status.ALLOWED else Answer.DENY,
        # For the tool decided, even when its name holds a "*": never a pattern.
        "literal": True,
    }
    existing = Rule.objects.filter(
        **fields, arguments_match__isnull=True, expires_at__isnull=True
    ).first()
    if existing is not None:
        return existing
    note = reason or f"Remembered ({scope}) when deciding {row['approval_id']}"
    return Rule.objects.create(**fields, created_by_id=by_id, note=note)


def clean_arguments_match(value: Any) -> dict | None:
    """``value`` as a rule's ``arguments_match``: an object of argument name to pattern.

    Empty (``None``, ``{}``, ``""``) means no condition and gives ``None``.
    Anything but an object whose keys are non-empty strings and whose values
    are strings (patterns with ``*``) raises ``ValueError`` with a sentence
    for a person.
    """
    if value in (None, "", {}):
        return None
    if not isinstance(value, dict):
        raise ValueError(
            "Arguments match must be a JSON object of argument name to pattern, "
            'e.g. {"cmd": "ls *"}.'
        )
    for key, pattern in value.items():
        if not isinstance(key, str) or not key:
            raise ValueError("Every argument name must be a non-empty string.")
        if not isinstance(pattern, str):
            raise ValueError(
                f"The pattern for {key!r} must be a string; write numbers, true/false and "
                'lists as their JSON text, e.g. "1", "true", "[1,2]".'
            )
    return value


RULES_CHANGED = "rules_changed"


def invalidate(local_only: bool = False) -> None:
    """Drop this process's cached rules; unless ``local_only``, tell the others too.

    The others are told at once through this process's listener (started if
    need be: a process that changes rules takes part in the live site); every
    process also notices a change within ``RULES_CACHE_SECONDS`` by itself.
    """
    _cache.clear()
    if not local_only:
        listener.get_listener().publish({"type": RULES_CHANGED})


def connect() -> None:
    """Hook the rule cache to the listener (called from ``AppConfig.ready``)."""
    listener.on_message(RULES_CHANGED, lambda event: invalidate(local_only=True))


@receiver(post_save, sender=Rule)
@receiver(post_delete, sender=Rule)
def _rule_changed(**kwargs: Any) -> None:
    _cache.clear()
    transaction.on_commit(invalidate, robust=True)
