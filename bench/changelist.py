"""How fast the Approval admin changelist renders with a million rows on SQLite.

Run: ``python bench/changelist.py`` (``--rows N`` for another size, ``--runs``
for more or fewer timed renders, ``--db PATH`` to keep the database elsewhere).
The database is a SQLite file in the temp directory, named by its row count and
reused on the next run (``--fresh`` rebuilds it). Rows are written with raw
``executemany`` (about a minute for a million); 0.1 % are pending, spread over two
years, 50 users, 40 tools, 20,000 sessions.

Each scenario renders the full changelist page through Django's test client
(middleware, session, permission checks, template) as a superuser with
``DEBUG`` off, after two warm-up renders. Reported: median and p99 (nearest
rank) over the runs, and the queries per render. Goals (issue 4): the
"awaiting a decision" filter and the search by an exact approval id each
under 300 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import figure, percentile, report, setup_django  # noqa: E402

MS = 1000.0
GOAL_MS = 300.0
USERS = 50
TOOLS = [f"tool_{i:02d}" for i in range(38)] + ["shell", "write_file"]
SESSIONS = 20_000
SPAN = timedelta(days=730)
COLUMNS = (
    "approval_id",
    "session_id",
    "user_id",
    "tool_name",
    "tool_call_id",
    "arguments",
    "status",
    "decided_via",
    "decided_by_id",
    "reason",
    "created_at",
    "decided_at",
    "expires_at",
    "waiter",
    # NOT NULL without a database default (added by issue 13's migration).
    "description",
    "editable",
    "execution_summary",
)


def _stamp(value: datetime) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S.%f")  # Django's SQLite storage, UTC


def _rows(n: int, user_ids: list[int], now: datetime):
    rng = random.Random(4)
    start = now - SPAN
    step = SPAN / n
    finals = ["allowed"] * 6 + ["denied"] * 2 + ["expired", "cancelled"]
    vias = {"allowed": "web", "denied": "admin", "expired": "timeout", "cancelled": "cancel"}
    for i in range(n):
        created = start + step * i
        pending = rng.random() < 0.001
        status = "pending" if pending else rng.choice(finals)
        user = rng.choice(user_ids)
        yield (
            f"bench-{i:08d}-{rng.getrandbits(64):016x}",
            f"session-{rng.randrange(SESSIONS):05d}",
            user,
            rng.choice(TOOLS),
            f"call_{i}",
            json.dumps({"cmd": f"ls /srv/{i % 977}", "n": i % 10}),
            status,
            "" if pending else vias[status],
            None if pending or status in ("expired", "cancelled") else user,
            "" if pending else "bench",
            _stamp(created),
            None if pending else _stamp(created + timedelta(seconds=rng.randrange(1, 600))),
            _stamp(created + timedelta(hours=1) if not pending else now + timedelta(hours=1)),
            "",
            "",
            False,
            "",
        )


def build(db_path: str, rows: int) -> tuple[float, bool]:
    """Fill the database with ``rows`` approvals unless it already has them."""
    from django.contrib.auth import get_user_model

    from approvals.models import Approval

    if Approval.objects.count() == rows:
        return 0.0, True
    Approval.objects.all().delete()
    users = get_user_model()
    for i in range(USERS):
        users.objects.get_or_create(username=f"bench-user-{i:02d}")
    user_ids = list(
        users.objects.filter(username__startswith="bench-user-").values_list("pk", flat=True)
    )
    t0 = time.perf_counter()
    con = sqlite3.connect(db_path)
    con.execute("PRAGMA synchronous=OFF")
    table = Approval._meta.db_table
    sql = f"INSERT INTO {table} ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})"
    with con:
        con.executemany(sql, _rows(rows, user_ids, datetime.now(UTC).replace(tzinfo=None)))
    con.execute("ANALYZE")
    con.close()
    return time.perf_counter() - t0, False


def measure(client, url: str, runs: int) -> tuple[list[float], list[float], int]:
    """Render ``url`` ``runs`` times after two warm-ups: wall ms, CPU ms, queries per render.

    CPU time (this process, SQLite included: it runs in-process) is the figure
    to trust on a loaded machine, where wall time also counts waiting for a core.
    """
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    for _ in range(2):
        assert client.get(url).status_code == 200, url
    wall, cpu = [], []
    for _ in range(runs):
        c0, t0 = time.process_time(), time.perf_counter()
        response = client.get(url)
        wall.append((time.perf_counter() - t0) * MS)
        cpu.append((time.process_time() - c0) * MS)
        assert response.status_code == 200, url
    with CaptureQueriesContext(connection) as ctx:
        client.get(url)
    return wall, cpu, len(ctx.captured_queries)


def scenarios(url: str, approval_id: str) -> dict[str, tuple[str, str, bool]]:
    """key: (label, changelist URL, whether the 300 ms goal applies)."""
    return {
        "pending": ("the 'awaiting a decision' filter", url + "?awaiting=yes", True),
        "status_pending": ("status = pending", url + "?status__exact=pending", False),
        "search_id": ("search by an exact approval id", url + f"?q={approval_id}", True),
        "search_text": ("search by text (a table scan)", url + "?q=tool_07", False),
        "all": ("no filter (first page)", url, False),
        "year": (
            "one year (date hierarchy)",
            f"{url}?created_at__year={datetime.now().year}",
            False,
        ),
    }


def figures_for(client, url: str, approval_id: str, runs: int) -> dict:
    """Render every scenario ``runs`` times; the figures for the report."""
    figures = {}
    for key, (label, target, goal) in scenarios(url, approval_id).items():
        wall, cpu, queries = measure(client, target, runs)
        p50, p99 = statistics.median(wall), percentile(wall, 99)
        aim = f"< {GOAL_MS:.0f} ms" if goal else ""
        figures[f"{key}_p50"] = figure(
            p50, "ms", f"{label}, median", aim, p50 < GOAL_MS if goal else None
        )
        figures[f"{key}_p99"] = figure(
            p99, "ms", f"{label}, p99", aim, p99 < GOAL_MS if goal else None
        )
        figures[f"{key}_cpu"] = figure(statistics.median(cpu), "ms", f"{label}, CPU median")
        figures[f"{key}_queries"] = figure(queries, "queries", f"{label}, queries per render")
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--db", help="SQLite file to build or reuse")
    parser.add_argument("--fresh", action="store_true", help="rebuild the database")
    args = parser.parse_args()
    db_path = args.db or os.path.join(
        tempfile.gettempdir(), f"toolgate-changelist-{args.rows}.sqlite3"
    )
    if args.fresh and os.path.exists(db_path):
        os.unlink(db_path)
    os.environ.setdefault("DJANGO_SECRET_KEY", "bench-" + "x" * 50)
    os.environ.setdefault("DJANGO_DEBUG", "0")
    setup_django(f"sqlite:///{db_path}")

    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.test import Client
    from django.urls import reverse

    from approvals.models import Approval

    settings.ALLOWED_HOSTS.append("testserver")  # the test client's host name
    built_s, reused = build(db_path, args.rows)
    admin_user, _ = get_user_model().objects.get_or_create(
        username="bench-admin", defaults={"is_staff": True, "is_superuser": True}
    )
    client = Client()
    client.force_login(admin_user)
    url = reverse("admin:approvals_approval_changelist")
    middle = Approval.objects.order_by("pk").values_list("approval_id", flat=True)[args.rows // 2]
    figures = figures_for(client, url, middle, args.runs)
    load = os.getloadavg()[0] / (os.cpu_count() or 1)
    notes = [
        f"{args.rows:,} rows in {db_path} ({'reused' if reused else f'built in {built_s:.1f} s'}); "
        f"{args.runs} renders per scenario, SQLite {sqlite3.sqlite_version}; "
        f"load average per core {load:.1f} (wall times grow with it, CPU times do not)"
    ]
    report("admin changelist", figures, notes)


if __name__ == "__main__":
    main()
