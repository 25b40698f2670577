"""Rule patterns and the rule index: pure Python, no database."""

from __future__ import annotations

import random
import re
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from approvals import rules

# -- patterns ----------------------------------------------------------------


@pytest.mark.parametrize(
    "pattern, value, expected",
    [
        ("shell", "shell", True),
        ("shell", "Shell", False),
        ("shell", "shell2", False),
        ("*", "", True),
        ("*", "anything at all", True),
        ("**", "x", True),
        ("git_*", "git_status", True),
        ("git_*", "git_", True),
        ("git_*", "agit_status", False),
        ("*_file", "write_file", True),
        ("*_file", "write_file2", False),
        ("a*b*c", "abc", True),
        ("a*b*c", "aXbYc", True),
        ("a*b*c", "acb", False),
        ("ab*ba", "aba", False),
        ("ab*ba", "abba", True),
        ("git status*", "git status --short", True),
        ("git status*", "git push; git status", False),
        ("rm -rf *", "rm -rf /", True),
        ("*.*", "a.b", True),
        ("a.c", "abc", False),  # only * is special
        ("[ab]", "a", False),
        ("x?", "xy", False),
    ],
)
def test_pattern(pattern, value, expected):
    assert rules.matches(pattern, value) is expected


def test_patterns_agree_with_a_regex_reference_on_random_input():
    rng = random.Random(6)
    for _ in range(3000):
        pattern = "".join(rng.choice("ab*") for _ in range(rng.randint(0, 6)))
        value = "".join(rng.choice("ab") for _ in range(rng.randint(0, 8)))
        regex = "".join(".*" if c == "*" else re.escape(c) for c in pattern)
        expected = re.fullmatch(regex, value, re.S) is not None
        assert rules.matches(pattern, value) is expected, (pattern, value)


def test_a_pathological_pattern_is_fast():
    started = time.perf_counter()
    assert not rules.matches("*a" * 30 + "*b", "a" * 20_000)
    assert time.perf_counter() - started < 0.5


@pytest.mark.parametrize(
    "value, text",
    [
        ("x", "x"),
        (1, "1"),
        (1.5, "1.5"),
        (True, "true"),
        (None, "null"),
        (["a", "b"], '["a","b"]'),
        ({"b": 1, "a": "é"}, '{"a":"é","b":1}'),
    ],
)
def test_non_string_arguments_compare_as_compact_json(value, text):
    assert rules.as_text(value) == text


def test_index_agrees_with_a_plain_scan_of_random_rules():
    rng = random.Random(60)
    now = timezone.now()
    tools = ["shell", "read_file", "write_file", "*", "read_*", "*_file", "sh*ll", "re*e", "s*"]
    rows = [
        {
            "pk": pk,
            "user_id": rng.choice([None, 1, 2]),
            "session_id": rng.choice(["", "s1", "s2"]),
            "tool_name": rng.choice(tools),
            "arguments_match": rng.choice(
                [None, {}, {"a": "x*"}, {"a": "*y", "b": "1"}, {"a": "xy"}, {"b": "[1,*"}]
                + [{"a": "x*z", "b": "*"}, {"b": "*", "a": "xz"}]
            ),
            "decision": rng.choice(["allow", "deny"]),
            "expires_at": rng.choice([None, now - timedelta(1), now + timedelta(1)]),
            "note": "",
        }
        for pk in rng.sample(range(1, 5000), 400)
    ]
    cached = [rules.compile_rule(row) for row in rows]
    index = rules.RuleIndex(cached)

    def plain_scan(user, session, tool, args):
        found = [
            r
            for r in cached
            if r.user_id in (None, user)
            and r.session_id in ("", session)
            and r.applies(tool, args, now)
        ]
        denies = [r.pk for r in found if r.decision == "deny"]
        allows = [r.pk for r in found if r.decision == "allow"]
        return min(denies) if denies else (min(allows) if allows else None)

    for _ in range(2000):
        call = (
            rng.choice([None, 1, 2, 3]),
            rng.choice(["", "s1", "s2", "s3"]),
            rng.choice(["shell", "read_file", "write_file", "other"]),
            rng.choice(
                [{}, None, {"a": "xy"}, {"a": "xz", "b": 1}, {"a": "y", "b": "1"}]
                + [{"a": "xyz", "b": [1, 2]}, {"b": [1]}, {"a": "x"}]
            ),
        )
        got = index.match(*call, now)
        assert (got.pk if got else None) == plain_scan(*call), call


@pytest.mark.parametrize(
    "value, error",
    [
        (["cmd"], "JSON object"),
        ("git *", "JSON object"),
        ({"n": 1}, "must be a string"),
        ({"": "x"}, "non-empty string"),
        ({"cmd": None}, "must be a string"),
    ],
)
def test_arguments_match_must_be_an_object_of_string_patterns(value, error):
    with pytest.raises(ValueError, match=error):
        rules.clean_arguments_match(value)


def test_an_empty_arguments_match_means_no_condition():
    assert rules.clean_arguments_match(None) is None
    assert rules.clean_arguments_match({}) is None
    assert rules.clean_arguments_match("") is None
    assert rules.clean_arguments_match({"cmd": "ls *"}) == {"cmd": "ls *"}
