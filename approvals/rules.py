"""Standing rules: which calls are answered without asking anyone.

Rules are cached per process as an index (exact tool names in a dict keyed by
user, session and tool; ``*`` patterns compiled once, in short per-user and
per-session lists), so matching a call costs a few dictionary look-ups however
many rules the table holds. A change made in this process (admin,
``remember``) drops the cache at once and tells the other processes over the
channel layer; every process also asks the database at most once per
``RULES_CACHE_SECONDS`` whether anything changed, so a change takes effect
everywhere within about a second even without a cross-process channel layer.

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

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import Count, Max
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver
from django.utils import timezone

from .conf import setting
from .models import Decision, Rule

logger = logging.getLogger("approvals.rules")

Matcher = Callable[[str], bool]


# -- patterns --------------------------------------------------------------


def _always(value: str) -> bool:
    return True


def compile_pattern(pattern: str) -> Matcher:
    """A test for ``pattern``: ``*`` matches any run of characters, the rest is literal.

    Matching runs in linear-ish time with ``str`` methods (no regular
    expressions, so no pattern can make it backtrack for long).
    """
    if "*" not in pattern:
        return pattern.__eq__
    if pattern.strip("*") == "":
        return _always
    head, *middle, tail = pattern.split("*")
    middle = [part for part in middle if part]
    fixed = len(head) + len(tail)

    def test(value: str) -> bool:
        if len(value) < fixed or not value.startswith(head) or not value.endswith(tail):
            return False
        pos, end = len(head), len(value) - len(tail)
        for part in middle:
            found = value.find(part, pos, end)
            if found < 0:
                return False
            pos = found + len(part)
        return True

    return test


def as_text(value: Any) -> str:
    """How an argument value is compared with a pattern: strings as they are, the rest as JSON."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(
            value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str
        )
    except (TypeError, ValueError):
        return str(value)


def matches(pattern: Any, value: Any) -> bool:
    """True when ``value`` (compared as text, see :func:`as_text`) fits ``pattern``."""
    return compile_pattern(as_text(pattern))(as_text(value))


# -- the cached rules -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CachedRule:
    """One rule as the matcher holds it (plain values, patterns compiled)."""

    pk: int
    user_id: Any
    session_id: str
    tool_name: str
    decision: str
    expires_at: datetime | None
    note: str
    tool_test: Matcher
    argument_tests: tuple[tuple[str, Matcher], ...]

    def applies(self, tool_name: str, arguments: Any, now: datetime) -> bool:
        """True when this rule answers a call (user and session were matched by the index)."""
        if self.expires_at is not None and self.expires_at <= now:
            return False
        if not self.tool_test(tool_name):
            return False
        if self.argument_tests:
            if not isinstance(arguments, dict):
                return False
            for key, test in self.argument_tests:
                if key not in arguments or not test(as_text(arguments[key])):
                    return False
        return True


def _cached(row: dict) -> CachedRule | None:
    spec = row["arguments_match"]
    if spec is not None and not isinstance(spec, dict):
        logger.warning("approvals: rule #%s ignored: arguments_match is not an object", row["pk"])
        return None
    tests = tuple((str(key), compile_pattern(as_text(p))) for key, p in (spec or {}).items())
    return CachedRule(
        pk=row["pk"],
        user_id=row["user_id"],
        session_id=row["session_id"] or "",
        tool_name=row["tool_name"],
        decision=row["decision"],
        expires_at=row["expires_at"],
        note=row["note"] or "",
        tool_test=compile_pattern(row["tool_name"]),
        argument_tests=tests,
    )


class RuleIndex:
    """Rules keyed so a call looks at only those that could match it.

    Exact tool names live in a dict keyed ``(user_id, session_id, tool_name)``;
    rules whose tool name has a ``*`` in lists keyed ``(user_id, session_id)``.
    ``None``/``""`` in a key stand for "every user"/"every session".
    """

    def __init__(self, rules: Iterable[CachedRule]) -> None:
        self.exact: dict[tuple, list[CachedRule]] = {}
        self.patterns: dict[tuple, list[CachedRule]] = {}
        self.size = 0
        for rule in rules:
            self.size += 1
            if "*" in rule.tool_name:
                key = (rule.user_id, rule.session_id)
                self.patterns.setdefault(key, []).append(rule)
            else:
                key = (rule.user_id, rule.session_id, rule.tool_name)
                self.exact.setdefault(key, []).append(rule)

    def candidates(self, user_id: Any, session_id: str, tool_name: str) -> list[CachedRule]:
        """Every rule whose user, session and (exact) tool name could fit this call."""
        users = (None,) if user_id is None else (user_id, None)
        sessions = ("",) if not session_id else (session_id, "")
        found: list[CachedRule] = []
        for user in users:
            for session in sessions:
                found.extend(self.exact.get((user, session, tool_name), ()))
                found.extend(self.patterns.get((user, session), ()))
        return found

    def match(
        self, user_id: Any, session_id: str, tool_name: str, arguments: Any, now: datetime
    ) -> CachedRule | None:
        """The rule that answers the call: the oldest matching deny, else the oldest allow."""
        deny = allow = None
        for rule in self.candidates(user_id, session_id, tool_name):
            if not rule.applies(tool_name, arguments, now):
                continue
            if rule.decision == Decision.DENY:
                if deny is None or rule.pk < deny.pk:
                    deny = rule
            elif allow is None or rule.pk < allow.pk:
                allow = rule
        return deny or allow



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
    now = timezone.now()
    rows = (
        Rule.objects.exclude(expires_at__lte=now)
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
        )
    )
    cached = (_cached(row) for row in rows)
    return RuleIndex(rule for rule in cached if rule is not None)


def _normal_user_id(user_id: Any) -> Any:
    if user_id is None:
        return None
    from django.contrib.auth import get_user_model

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
    verb = "Allowed" if rule.decision == Decision.ALLOW else "Denied"
    text = f"{verb} by rule #{rule.pk} ({rule.tool_name})"
    return f"{text}: {rule.note}" if rule.note else text


def remember(row: dict, status: str, scope: str, by: Any, reason: str = "") -> Rule:
    """Store the rule a person asked for with their decision (inside its transaction).

    The rule is for the call's user (the person whose agent made the call),
    whoever decided it; ``created_by`` is the decider. ``"session"`` covers
    this session and this tool, ``"always"`` every session and this tool. A
    user without ``approvals.decide_approval`` may only remember decisions on
    their own calls (``PermissionDenied``), and ``"session"`` needs a call that
    has a session (``ValueError``); either rolls the decision back. An
    identical remembered rule is reused rather than duplicated.
    """
    if scope not in ("session", "always"):
        raise ValueError(f'remember must be "session" or "always", not {scope!r}')
    if scope == "session" and not row["session_id"]:
        raise ValueError('remember "session" needs a call with a session_id')
    owner = row["user_id"]
    by_id = getattr(by, "pk", by)
    if hasattr(by, "has_perm") and owner != by_id and not by.has_perm("approvals.decide_approval"):
        raise PermissionDenied("only the call's user or a decider may remember this decision")
    fields = {
        "user_id": owner,
        "session_id": row["session_id"] if scope == "session" else "",
        "tool_name": row["tool_name"],
        "decision": Decision.ALLOW if status == "allowed" else Decision.DENY,
    }
    existing = Rule.objects.filter(
        **fields, arguments_match__isnull=True, expires_at__isnull=True
    ).first()
    if existing is not None:
        return existing
    note = reason or f"Remembered ({scope}) when deciding {row['approval_id']}"
    return Rule.objects.create(**fields, created_by_id=by_id, note=note)


def invalidate(local_only: bool = False) -> None:
    """Drop this process's cached rules; unless ``local_only``, tell the others too."""
    _cache.clear()
    if not local_only:
        from . import listener

        listener.get_listener().publish({"type": "rules_changed"})


@receiver(post_save, sender=Rule)
@receiver(post_delete, sender=Rule)
def _rule_changed(**kwargs: Any) -> None:
    _cache.clear()
    transaction.on_commit(invalidate, robust=True)
