"""What every benchmark shares: Django on a throwaway database, percentiles, and one report line.

A benchmark prints whatever it likes for a person, then ends with exactly one
line ``BENCH_JSON {...}`` made by :func:`report`. ``bench/run_all.py`` reads
that line to build the figures table in BENCHMARKS.md; a script that prints no
such line still runs, and its last lines of output are kept verbatim.
"""

from __future__ import annotations

import json
import os
import resource
import secrets
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MARK = "BENCH_JSON "
# DEBUG off needs a secret key of its own; one per run, shared by every child process.
_SECRET_KEY = "bench-" + secrets.token_hex(24)


def setup_django(database_url: str | None = None, *, migrate: bool = True) -> str:
    """Set up Django with the site settings on ``database_url`` (default: a new temp SQLite).

    Returns the database URL used, so child processes can share it. The
    environment decides the channel layer (``REDIS_URL``) as for the site.
    """
    if database_url is None:
        fd, path = tempfile.mkstemp(prefix="toolgate-bench-", suffix=".sqlite3")
        os.close(fd)
        database_url = f"sqlite:///{path}"
    os.environ["DATABASE_URL"] = database_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "toolgate_site.settings")
    os.environ.setdefault("TOOLGATE_QUIET", "1")
    # Production-like: DEBUG on would keep every query's SQL in memory.
    os.environ.setdefault("DJANGO_DEBUG", "0")
    os.environ.setdefault("DJANGO_SECRET_KEY", _SECRET_KEY)
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    if migrate:
        from django.core.management import call_command

        call_command("migrate", verbosity=0, interactive=False)
    return database_url


def remove_sqlite(database_url: str) -> None:
    """Delete a temp SQLite database file and its WAL companions."""
    if not database_url.startswith("sqlite:///"):
        return
    path = database_url[len("sqlite:///") :]
    if not path.startswith("/"):
        path = "/" + path
    for suffix in ("", "-wal", "-shm", "-journal"):
        try:
            os.unlink(path + suffix)
        except FileNotFoundError:
            pass


def child_env(database_url: str) -> dict[str, str]:
    """Environment for a child process on the same database and settings."""
    env = {**os.environ, "DATABASE_URL": database_url, "TOOLGATE_QUIET": "1"}
    env.setdefault("DJANGO_DEBUG", "0")
    env.setdefault("DJANGO_SECRET_KEY", _SECRET_KEY)
    env["DJANGO_SETTINGS_MODULE"] = "toolgate_site.settings"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0-100) by nearest rank; ``nan`` for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


def rss_mib() -> float:
    """This process's resident set size now, in MiB (from /proc; peak RSS elsewhere)."""
    try:
        with open("/proc/self/statm") as fh:
            pages = int(fh.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_of(pid: int) -> float:
    """Another process's resident set size in MiB (Linux /proc)."""
    with open(f"/proc/{pid}/statm") as fh:
        pages = int(fh.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def cpu_of(pid: int) -> float:
    """CPU seconds (user + system, all threads) another process has used (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of each thread of another process, by kernel thread id (Linux
    ``/proc/<pid>/task/*/schedstat``, nanoseconds)."""
    spent = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as fh:
                spent[tid] = int(fh.read().split()[0]) / 1e9
        except OSError:
            continue  # the thread ended meanwhile
    return spent


def cpu_by_name(
    names: dict[str, str], before: dict[str, float], after: dict[str, float], scale: float
) -> dict[str, float]:
    """The CPU each named thread used between two :func:`thread_cpu` readings, times
    ``scale``, largest first; ``names`` maps kernel thread ids to names (a thread
    not in it counts as ``other``: daphne's or a library's own)."""
    spent: dict[str, float] = {}
    for tid, seconds in after.items():
        name = names.get(tid, "other")
        spent[name] = spent.get(name, 0.0) + (seconds - before.get(tid, 0.0)) * scale
    return dict(sorted(spent.items(), key=lambda item: -item[1]))


def cpu_seconds() -> float:
    """CPU time (user + system) this process has used so far, all threads."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def idle_cpu_percent(seconds: float, sleep=time.sleep) -> float:
    """Percent of one core this process uses while the caller sleeps ``seconds``."""
    c0, t0 = cpu_seconds(), time.monotonic()
    sleep(seconds)
    return 100 * (cpu_seconds() - c0) / (time.monotonic() - t0)


def figure(
    value: float | int | None, unit: str, label: str, goal: str = "", met: bool | None = None
) -> dict[str, Any]:
    """One named figure: value, unit, a label for the table, the goal and whether it was met."""
    if isinstance(value, float):
        value = round(value, 3)
    return {"value": value, "unit": unit, "label": label, "goal": goal, "met": met}


def report(name: str, figures: dict[str, dict[str, Any]], notes: list[str] | None = None) -> None:
    """Print the figures for a person, then the one ``BENCH_JSON`` line run_all reads."""
    print(f"\n== {name}")
    for key, f in figures.items():
        goal = f" (goal {f['goal']}: {'met' if f['met'] else 'MISSED'})" if f.get("goal") else ""
        print(f"  {f['label']}: {f['value']} {f['unit']}{goal}  [{key}]")
    for note in notes or []:
        print(f"  note: {note}")
    payload = {"name": name, "figures": figures, "notes": notes or []}
    print(MARK + json.dumps(payload), flush=True)  # keeps the figures in their order


def skip(name: str, reason: str) -> None:
    """Report that a benchmark could not run here (a missing service), and why."""
    print(f"\n== {name}: skipped: {reason}")
    print(MARK + json.dumps({"name": name, "skipped": reason}), flush=True)
