"""What standing rules cost the gate: latency with 0, 100 and 1,000 rules in the table.

Run: ``python bench/rules.py`` (``--quick`` for a shorter run,
``--database-url`` for another database). Uses a new temporary SQLite file
database with the site's settings, migrated first; every call writes its audit
row.

One gated call here is ``begin_tool_decision`` + ``resolve_tool_decision`` +
``wait_tool_decision`` in one thread (the ask path), or ``begin`` + ``wait``
when a rule answers. Scenarios, each with rules that do *not* match the call
unless said so:

* ``0`` rules (the baseline), ``100`` and ``1000`` rules of a realistic mix:
  other users' rules for the same tool, this user's remembered rules for other
  sessions, other tools, ``*`` patterns that fail, and this user's rules for
  the same tool whose ``arguments_match`` fails;
* ``1000 worst``: every rule is ``*`` for every user and session and fails only
  on its arguments, so the index cannot rule any out;
* ``1000 + match``: the realistic 1,000 plus one allow rule that answers.

Scenarios are measured in interleaved rounds, each round in a new shuffled
order, so drift in the machine hits all alike. Reported: p50/p99 per scenario, the
p50 difference against the 0-rule baseline (goal: at most 1 ms with 1,000
rules), the bare ``rules.match`` cost, and how often the rule table was
queried (the version check must not run per call).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import figure, percentile, remove_sqlite, report, setup_django  # noqa: E402

MS = 1000.0
SESSION = "bench-session"
TOOL = "shell"
ARGS = {"cmd": "ls -la /srv", "cwd": "/srv"}


def mixed_rules(n: int, me, others) -> list:
    """``n`` rules that do not match (``me``, SESSION, TOOL, ARGS), in a realistic mix."""
    from approvals.models import Rule

    out = []
    for i in range(n):
        kind = i % 20
        if kind < 6:  # other users' rules for the same tool
            out.append(Rule(user=others[i % len(others)], tool_name=TOOL, decision="allow"))
        elif kind < 10:  # my remembered rules for other sessions
            out.append(Rule(user=me, session_id=f"old-{i}", tool_name=TOOL, decision="allow"))
        elif kind < 14:  # other tools, every user
            out.append(Rule(tool_name=f"tool_{i}", decision="deny" if i % 2 else "allow"))
        elif kind < 17:  # patterns that fail on the name, every user
            out.append(Rule(tool_name=f"deploy_*_{i}", decision="deny"))
        else:  # my rules for this tool that fail on the arguments
            out.append(
                Rule(
                    user=me, tool_name=TOOL, arguments_match={"cmd": f"git {i} *"}, decision="allow"
                )
            )
    return out


def worst_rules(n: int) -> list:
    """``n`` rules every call must test: ``*`` for everyone, failing on the arguments."""
    from approvals.models import Rule

    return [
        Rule(tool_name="*", arguments_match={"cmd": f"never-{i} *"}, decision="deny")
        for i in range(n)
    ]


def set_rules(rules_list: list) -> None:
    from approvals import rules
    from approvals.models import Rule

    Rule.objects.all().delete()
    Rule.objects.bulk_create(rules_list, batch_size=500)
    rules.invalidate(local_only=True)  # bulk_create sends no signals


def gated_call(user, expect: str) -> tuple[float, float]:
    """One call through the gate: (wall seconds, this thread's CPU seconds) begin to answer."""
    from approvals import gate
    from approvals.models import Approval

    aid = gate.new_approval_id()
    c0, t0 = time.thread_time(), time.perf_counter()
    slot = gate.begin_tool_decision(SESSION, aid, tool_name=TOOL, arguments=ARGS, user=user)
    if slot.status is None:
        gate.resolve_tool_decision(aid, "allow", SESSION)
    answer = gate.wait_tool_decision(slot, aid)
    elapsed, cpu = time.perf_counter() - t0, time.thread_time() - c0
    assert answer == "allow", (answer, gate.denial_message(aid))
    via = Approval.objects.filter(approval_id=aid).values_list("decided_via", flat=True)[0]
    assert via == expect, (via, expect)
    return elapsed, cpu


def match_cost(user, n: int) -> float:
    """Median seconds for one ``rules.match`` on a warm cache."""
    from approvals import rules

    rules.match(user.pk, SESSION, TOOL, ARGS)
    samples = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            rules.match(user.pk, SESSION, TOOL, ARGS)
        samples.append((time.perf_counter() - t0) / n)
    return statistics.median(samples)


class RuleQueries:
    """Counts queries on the rule table (version checks, reloads) while ``active``."""

    def __init__(self) -> None:
        self.count = 0
        self.active = False

    def __call__(self, execute, sql, params, many, context):
        if self.active and "approvals_rule" in sql:
            self.count += 1
        return execute(sql, params, many, context)


def run(rounds: int, per_round: int) -> dict:
    from django.contrib.auth import get_user_model
    from django.db import connection

    from approvals.models import Rule

    User = get_user_model()
    me = User.objects.create(username="bench-me")
    others = [User.objects.create(username=f"bench-{i}") for i in range(20)]
    matching = mixed_rules(1000, me, others)
    matching.append(
        Rule(user=me, tool_name=TOOL, arguments_match={"cmd": "ls *"}, decision="allow")
    )
    scenarios = {
        "0": ([], "api"),
        "100": (mixed_rules(100, me, others), "api"),
        "1000": (mixed_rules(1000, me, others), "api"),
        "1000 worst": (worst_rules(1000), "api"),
        "1000 + match": (matching, "rule"),
    }
    latency: dict[str, list[float]] = {name: [] for name in scenarios}
    cpu: dict[str, list[float]] = {name: [] for name in scenarios}
    counter = RuleQueries()
    measured = 0.0
    rng = random.Random(6)
    with connection.execute_wrapper(counter):
        order = list(scenarios)
        for _ in range(rounds):
            rng.shuffle(order)  # no scenario always follows the same table change
            for name in order:
                rules_list, via = scenarios[name]
                set_rules(rules_list)
                for _ in range(20):  # warm: cache loaded, statements prepared
                    gated_call(me, via)
                counter.active = True
                t0 = time.monotonic()
                for _ in range(per_round):
                    wall, used = gated_call(me, via)
                    latency[name].append(wall)
                    cpu[name].append(used)
                measured += time.monotonic() - t0
                counter.active = False
    match_s = {}
    for name, (rules_list, _) in scenarios.items():
        set_rules(rules_list)
        match_s[name] = match_cost(me, 2000)
    return {
        "latency": latency,
        "cpu": cpu,
        "match": match_s,
        "rule_queries": counter.count,
        "calls": rounds * per_round * len(scenarios),
        "seconds": measured,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls (CI smoke run)")
    parser.add_argument("--database-url", help="default: a new temporary SQLite file")
    opts = parser.parse_args()
    url = setup_django(opts.database_url)
    try:
        rounds, per_round = (2, 100) if opts.quick else (5, 300)
        result = run(rounds, per_round)
    finally:
        from approvals import listener

        listener.shutdown()
        if opts.database_url is None:
            remove_sqlite(url)
    publish(result, rounds * per_round)


def publish(result: dict, n: int) -> None:
    lat = result["latency"]
    base = percentile(lat["0"], 50)
    figures = {}
    for name, samples in lat.items():
        key = name.replace(" + ", "_plus_").replace(" ", "_")
        p50, p99 = percentile(samples, 50), percentile(samples, 99)
        figures[f"gate_p50_ms_{key}"] = figure(p50 * MS, "ms", f"gate p50, {name} rules")
        figures[f"gate_p99_ms_{key}"] = figure(p99 * MS, "ms", f"gate p99, {name} rules")
        if name != "0":
            delta = (p50 - base) * MS
            goal = "<= 1 ms" if name.startswith("1000") or name == "100" else ""
            figures[f"gate_p50_delta_ms_{key}"] = figure(
                delta,
                "ms",
                f"gate p50 minus 0-rule p50, {name} rules (ratio {p50 / base:.2f})",
                goal,
                delta <= 1.0 if goal else None,
            )
    cpu_base = percentile(result["cpu"]["0"], 50)
    for name, samples in result["cpu"].items():
        key = name.replace(" + ", "_plus_").replace(" ", "_")
        p50 = percentile(samples, 50)
        figures[f"gate_cpu_p50_ms_{key}"] = figure(
            p50 * MS, "ms", f"gate CPU p50 (calling thread), {name} rules"
        )
        if name != "0":
            delta = (p50 - cpu_base) * MS
            figures[f"gate_cpu_p50_delta_ms_{key}"] = figure(
                delta, "ms", f"gate CPU p50 minus 0-rule CPU p50, {name} rules"
            )
    for name, seconds in result["match"].items():
        key = name.replace(" + ", "_plus_").replace(" ", "_")
        figures[f"match_us_{key}"] = figure(seconds * 1e6, "us", f"rules.match alone, {name} rules")
    per_second = result["rule_queries"] / result["seconds"]
    figures["rule_queries_per_call"] = figure(
        result["rule_queries"] / result["calls"],
        "queries",
        "rule-table queries per gated call (measured calls only)",
    )
    figures["rule_queries_per_second"] = figure(
        per_second,
        "queries/s",
        "rule-table queries per second of gating (goal <= 1/RULES_CACHE_SECONDS)",
        "<= 1/s",
        per_second <= 1.05,
    )
    notes = [
        f"{n} calls per scenario in interleaved rounds; one thread; SQLite file database, "
        "every call writes (and decides) its audit row",
        "ask path: begin + resolve + wait; '1000 + match': begin + wait, answered by a rule",
    ]
    report("rules", figures, notes)


if __name__ == "__main__":
    main()
