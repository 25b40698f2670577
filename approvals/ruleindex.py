"""Rule patterns and the in-memory index that matches a call against many rules.

Pure Python, no database: :mod:`approvals.rules` loads the rows and keeps one
:class:`RuleIndex` per process. The index looks at only the rules that could
fit a call: exact tool names are dictionary keys (with user and session), and
``*`` patterns, for tool names and for argument values, are grouped by the
literal text before their first ``*``, so a call looks up a few prefixes of its
tool name and argument values instead of testing every rule.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .models import Answer

logger = logging.getLogger("approvals.rules")

Matcher = Callable[[str], bool]


# -- patterns --------------------------------------------------------------


def _always(value: str) -> bool:
    return True


def compile_pattern(pattern: str) -> Matcher:
    """A test for ``pattern``: ``*`` matches any run of characters, the rest is literal.

    No regular expressions: a pattern is checked with ``str`` prefix, suffix
    and find operations, so no pattern can make matching backtrack for long.
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
    """How an argument value is compared with a pattern: strings as they are, the rest as JSON.

    Non-strings become compact JSON with sorted keys: ``1``, ``1.5``, ``true``,
    ``null``, ``["a","b"]``, ``{"a":1}``.
    """
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


def literal_prefix(pattern: str) -> str:
    """The text every value matching ``pattern`` starts with."""
    return pattern.split("*", 1)[0]


# -- one rule ----------------------------------------------------------------


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
    #: (argument name, literal prefix of its pattern) the index files the rule under.
    argument_key: tuple[str, str] | None
    #: The tool name is an exact name, ``*`` included (a remembered rule).
    literal: bool = False

    @property
    def tool_pattern(self) -> bool:
        """True when the tool name is a pattern (has a ``*`` and is not literal)."""
        return not self.literal and "*" in self.tool_name

    def applies(self, tool_name: str, arguments: Any, now: datetime) -> bool:
        """True when the rule's tool name, arguments and expiry fit (user and session aside)."""
        texts = ArgumentTexts(arguments)
        return self._fits(tool_name, texts, now)

    def _fits(self, tool_name: str, texts: ArgumentTexts, now: datetime) -> bool:
        if self.expires_at is not None and self.expires_at <= now:
            return False
        if not self.tool_test(tool_name):
            return False
        for key, test in self.argument_tests:
            text = texts.get(key)
            if text is None or not test(text):
                return False
        return True


def compile_rule(row: dict) -> CachedRule | None:
    """A :class:`CachedRule` from a rule's values, or ``None`` (logged) for a malformed rule."""
    spec = row["arguments_match"]
    if spec is not None and not isinstance(spec, dict):
        logger.warning("approvals: rule #%s ignored: arguments_match is not an object", row["pk"])
        return None
    if row["decision"] not in Answer.values:
        logger.warning("approvals: rule #%s ignored: decision %r", row["pk"], row["decision"])
        return None
    patterns = [(str(key), as_text(p)) for key, p in (spec or {}).items()]
    argument_key = None
    if patterns:
        name, pattern = max(patterns, key=lambda kp: len(literal_prefix(kp[1])))
        argument_key = (name, literal_prefix(pattern))
    return CachedRule(
        pk=row["pk"],
        user_id=row["user_id"],
        session_id=row["session_id"] or "",
        tool_name=row["tool_name"],
        decision=row["decision"],
        expires_at=row["expires_at"],
        note=row["note"] or "",
        tool_test=row["tool_name"].__eq__
        if row.get("literal")
        else compile_pattern(row["tool_name"]),
        argument_tests=tuple((key, compile_pattern(p)) for key, p in patterns),
        argument_key=argument_key,
        literal=bool(row.get("literal")),
    )


# -- the index ---------------------------------------------------------------


class ArgumentTexts:
    """A call's argument values as text, each converted at most once per match."""

    __slots__ = ("arguments", "texts")

    def __init__(self, arguments: Any) -> None:
        self.arguments = arguments if isinstance(arguments, dict) else {}
        self.texts: dict[str, str] = {}

    def get(self, key: str) -> str | None:
        text = self.texts.get(key)
        if text is None and key in self.arguments:
            text = self.texts[key] = as_text(self.arguments[key])
        return text


class _ByPrefix:
    """Items filed under a literal prefix; a text finds those whose prefix it starts with."""

    __slots__ = ("groups", "lengths")

    def __init__(self) -> None:
        self.groups: dict[str, Any] = {}
        self.lengths: list[int] = []

    def group(self, prefix: str, factory: Callable[[], Any]) -> Any:
        if prefix not in self.groups:
            self.groups[prefix] = factory()
            self.lengths = sorted({*self.lengths, len(prefix)})
        return self.groups[prefix]

    def lookup(self, text: str) -> Iterator[Any]:
        for n in self.lengths:
            if n > len(text):
                break
            found = self.groups.get(text[:n])
            if found is not None:
                yield found


class _Bucket:
    """Rules that share user, session and tool key: those without argument
    conditions in a list, the rest filed by one argument's literal prefix."""

    __slots__ = ("plain", "by_argument")

    def __init__(self) -> None:
        self.plain: list[CachedRule] = []
        self.by_argument: dict[str, _ByPrefix] = {}

    def add(self, rule: CachedRule) -> None:
        if rule.argument_key is None:
            self.plain.append(rule)
            return
        name, prefix = rule.argument_key
        self.by_argument.setdefault(name, _ByPrefix()).group(prefix, list).append(rule)

    def candidates(self, texts: ArgumentTexts) -> Iterator[CachedRule]:
        yield from self.plain
        for name, by_prefix in self.by_argument.items():
            text = texts.get(name)
            if text is not None:
                for group in by_prefix.lookup(text):
                    yield from group


class RuleIndex:
    """Rules keyed so a call looks at only those that could match it.

    Exact tool names: buckets keyed ``(user_id, session_id, tool_name)``.
    Tool names with a ``*``: per ``(user_id, session_id)``, buckets filed by
    the pattern's literal prefix. ``None``/``""`` in a key stand for "every
    user"/"every session".
    """

    def __init__(self, rules: Iterable[CachedRule]) -> None:
        self.exact: dict[tuple, _Bucket] = {}
        self.patterns: dict[tuple, _ByPrefix] = {}
        self.size = 0
        for rule in rules:
            self.size += 1
            if rule.tool_pattern:
                by_prefix = self.patterns.setdefault((rule.user_id, rule.session_id), _ByPrefix())
                bucket = by_prefix.group(literal_prefix(rule.tool_name), _Bucket)
            else:
                key = (rule.user_id, rule.session_id, rule.tool_name)
                bucket = self.exact.setdefault(key, _Bucket())
            bucket.add(rule)

    def _buckets(self, user_id: Any, session_id: str, tool_name: str) -> Iterator[_Bucket]:
        users = (None,) if user_id is None else (user_id, None)
        sessions = ("",) if not session_id else (session_id, "")
        for user in users:
            for session in sessions:
                bucket = self.exact.get((user, session, tool_name))
                if bucket is not None:
                    yield bucket
                by_prefix = self.patterns.get((user, session))
                if by_prefix is not None:
                    yield from by_prefix.lookup(tool_name)

    def match(
        self, user_id: Any, session_id: str, tool_name: str, arguments: Any, now: datetime
    ) -> CachedRule | None:
        """The rule that answers the call: the oldest matching deny, else the oldest allow."""
        deny = allow = None
        texts = ArgumentTexts(arguments)
        for bucket in self._buckets(user_id, session_id, tool_name):
            for rule in bucket.candidates(texts):
                if rule.decision == Answer.DENY:
                    if (deny is None or rule.pk < deny.pk) and rule._fits(tool_name, texts, now):
                        deny = rule
                elif (
                    deny is None
                    and (allow is None or rule.pk < allow.pk)
                    and rule._fits(tool_name, texts, now)
                ):
                    allow = rule
        return deny or allow
