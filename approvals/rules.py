"""Standing rules: which calls are answered without asking anyone.

Rules are cached per process and matched in Python. A change made in this
process (admin, ``remember``) drops the cache at once and tells the other
processes over the channel layer; every process also asks the database at
most once per ``RULES_CACHE_SECONDS`` whether anything changed, so a change
takes effect everywhere within about a second even without a channel layer.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from django.db import transaction
from django.db.models import Count, Max
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver
from django.utils import timezone

from .conf import setting
from .models import Decision, Rule


@lru_cache(maxsize=4096)
def _pattern(pattern: str) -> re.Pattern:
    """``*`` matches any run of characters; everything else is literal."""
    return re.compile("(?s:" + ".*".join(re.escape(p) for p in pattern.split("*")) + r")\Z")


def matches(pattern: str, value: Any) -> bool:
    """True when ``value`` (compared as a string) fits ``pattern``."""
    if not isinstance(value, str):
        if isinstance(value, bool) or value is None:
            value = {True: "true", False: "false", None: "null"}[value]
        else:
            value = str(value)
    if "*" not in pattern:
        return pattern == value
    return _pattern(pattern).match(value) is not None


@dataclass(frozen=True)
class CachedRule:
    pk: int
    user_id: Any
    session_id: str
    tool_name: str
    arguments_match: dict | None
    decision: str
    expires_at: Any

    def applies(self, user_id: Any, session_id: str, tool_name: str, arguments: Any, now) -> bool:
        if self.expires_at is not None and self.expires_at <= now:
            return False
        if self.user_id is not None and self.user_id != user_id:
            return False
        if self.session_id and self.session_id != session_id:
            return False
        if not matches(self.tool_name, tool_name):
            return False
        if self.arguments_match:
            if not isinstance(arguments, dict):
                return False
            for key, pattern in self.arguments_match.items():
                if key not in arguments or not matches(str(pattern), arguments[key]):
                    return False
        return True


class _Cache:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.rules: list[CachedRule] | None = None
        self.version: tuple | None = None
        self.checked = 0.0

    def get(self) -> list[CachedRule]:
        now = time.monotonic()
        if self.rules is not None and now - self.checked < setting("RULES_CACHE_SECONDS"):
            return self.rules
        version = _version()
        with self.lock:
            if self.rules is None or version != self.version:
                self.rules = _load()
                self.version = version
            self.checked = now
            return self.rules

    def clear(self) -> None:
        with self.lock:
            self.rules = None
            self.version = None


_cache = _Cache()


def _version() -> tuple:
    agg = Rule.objects.aggregate(n=Count("pk"), m=Max("updated_at"), k=Max("pk"))
    return (agg["n"], agg["m"], agg["k"])


def _load() -> list[CachedRule]:
    rows = Rule.objects.order_by("pk").values(
        "pk", "user_id", "session_id", "tool_name", "arguments_match", "decision", "expires_at"
    )
    return [CachedRule(**row) for row in rows]


def match(user_id: Any, session_id: str, tool_name: str, arguments: Any) -> CachedRule | None:
    """The rule that answers this call, or ``None``: any matching deny beats every allow."""
    now = timezone.now()
    allow = None
    for rule in _cache.get():
        if rule.applies(user_id, session_id, tool_name, arguments, now):
            if rule.decision == Decision.DENY:
                return rule
            if allow is None:
                allow = rule
    return allow


def describe(rule: CachedRule) -> str:
    """The reason recorded on a call a rule answered."""
    verb = "Allowed" if rule.decision == Decision.ALLOW else "Denied"
    return f"{verb} by rule #{rule.pk} ({rule.tool_name})"


def remember(row: dict, status: str, scope: str, by: Any) -> Rule:
    """Store the rule a person asked for with their decision (inside its transaction)."""
    decision = Decision.ALLOW if status == "allowed" else Decision.DENY
    user_id = row["user_id"] if row["user_id"] is not None else getattr(by, "pk", by)
    return Rule.objects.create(
        user_id=user_id,
        session_id=row["session_id"] if scope == "session" else "",
        tool_name=row["tool_name"],
        decision=decision,
        created_by_id=getattr(by, "pk", by),
        note=f"Remembered ({scope}) when deciding {row['approval_id']}",
    )


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
