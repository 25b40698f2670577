"""Run every benchmark in bench/ and rewrite the figures table in BENCHMARKS.md.

``make bench`` runs this. Each ``bench/*.py`` script (not ``_*.py``, not this
file) runs in its own process with the same interpreter; it prints what it
likes and ends with one ``BENCH_JSON {...}`` line (``_common.report``), or
``BENCH_JSON {"name": ..., "skipped": reason}`` when a service it needs is
missing. A script that prints no such line still counts: its last lines of
output are kept. The table between the markers in BENCHMARKS.md is replaced,
headed by the machine, Python, Django, date and the command used.

Options: ``--quick`` (shorter runs, for a smoke check), ``--only NAME ...``,
``--no-write`` (print only), ``--timeout SECONDS`` per script.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
DOC = ROOT / "BENCHMARKS.md"
RESULTS = BENCH / "results.json"  # the last run of each benchmark, so --only can merge
START = "<!-- figures:start (written by bench/run_all.py; edits here are overwritten) -->"
END = "<!-- figures:end -->"
MARK = "BENCH_JSON "
#: Run order (the rest follow alphabetically).
ORDER = [
    "gate",
    "rules",
    "http_load",
    "cross_process",
    "soak",
    "changelist",
    "agents",
    "webhooks",
    "slow_sockets",
]
#: Extra arguments, used only when the script's --help mentions the option.
FULL_ARGS: dict[str, list[str]] = {"soak": ["--seconds", "60"]}
QUICK_ARGS: dict[str, list[str]] = {
    "soak": ["--seconds", "15"],
    "changelist": ["--rows", "100000", "--runs", "5"],
}


def discover(only: list[str] | None) -> list[Path]:
    """The benchmark scripts to run, in a stable order."""
    found = {p.stem: p for p in BENCH.glob("*.py") if not p.stem.startswith("_")}
    found.pop("run_all", None)
    names = [n for n in ORDER if n in found] + sorted(set(found) - set(ORDER))
    if only:
        unknown = set(only) - set(found)
        if unknown:
            raise SystemExit(f"no such benchmark: {', '.join(sorted(unknown))}")
        names = [n for n in names if n in only]
    return [found[n] for n in names]


def arguments(script: Path, quick: bool) -> list[str]:
    """The command-line options this script accepts for a full or quick run."""
    try:
        helptext = subprocess.run(
            [sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=60
        ).stdout
    except subprocess.TimeoutExpired:
        helptext = ""
    wanted = (QUICK_ARGS if quick else FULL_ARGS).get(script.stem, [])
    if quick:
        wanted = (["--quick"] if "--quick" in helptext else []) + wanted
    out: list[str] = []
    i = 0
    while i < len(wanted):
        opt = wanted[i]
        takes_value = i + 1 < len(wanted) and not wanted[i + 1].startswith("--")
        if opt in helptext:
            out += wanted[i : i + 2] if takes_value else [opt]
        i += 2 if takes_value else 1
    return out


def services() -> dict[str, str]:
    """PostgreSQL and Redis for the benchmarks that need them: from the environment
    (``TOOLGATE_TEST_DATABASE_URL``, ``TOOLGATE_TEST_REDIS_URL``, as for the test suite),
    else the local defaults ``.ci/run`` uses when something listens there."""
    found = {}
    for var, default, port in (
        ("TOOLGATE_TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test", 5432),
        ("TOOLGATE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0", 6379),
    ):
        value = os.environ.get(var)
        if not value:
            try:
                socket.create_connection(("127.0.0.1", port), 0.5).close()
                value = default
            except OSError:
                continue
        found[var] = value
    return found


def run_one(script: Path, args: list[str], timeout: float, extra_env: dict) -> dict:
    """Run one script; return its parsed report (or what went wrong)."""
    cmd = [sys.executable, str(script), *args]
    print(f"\n### {script.name} {' '.join(args)}", flush=True)
    env = {**os.environ, **extra_env, "TOOLGATE_QUIET": "1", "PYTHONUNBUFFERED": "1"}
    # A group prefix of its own, so a run never talks to other deployments on a shared Redis.
    env.setdefault("TOOLGATE_GROUP_PREFIX", f"bench{os.getpid()}")
    t0 = time.monotonic()
    try:
        proc = subprocess.run(
            cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
        )
        stdout, stderr, rc = proc.stdout, proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:
        stdout = _text(exc.stdout)
        stderr = _text(exc.stderr) + f"\ntimed out after {timeout:.0f} s"
        rc = -1
    seconds = time.monotonic() - t0
    print(stdout.rstrip())
    if rc != 0:
        print(stderr.rstrip()[-3000:], file=sys.stderr)
    reports = parse(stdout)
    result = {"script": script.name, "args": args, "rc": rc, "seconds": round(seconds, 1)}
    if reports:
        result["reports"] = reports
    else:
        tail = [ln for ln in (stdout + "\n" + stderr).splitlines() if ln.strip()][-15:]
        result["raw"] = tail
    return result


def _text(value) -> str:
    if value is None:
        return ""
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def parse(stdout: str) -> list[dict]:
    """Every ``BENCH_JSON`` report in a script's output (malformed lines are ignored)."""
    out = []
    for line in stdout.splitlines():
        idx = line.find(MARK)
        if idx < 0:
            continue
        try:
            data = json.loads(line[idx + len(MARK) :])
        except ValueError:
            continue
        if isinstance(data, dict) and "name" in data:
            out.append(data)
    return out


def machine() -> dict[str, str]:
    """What the figures were measured on."""
    mem = ""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = f"{int(line.split()[1]) / 2**20:.1f} GiB"
    except OSError:
        pass
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        import django

        django_version = django.get_version()
    except ImportError:
        django_version = "not installed"
    return {
        "uname": " ".join(platform.uname()),
        "cpu": f"{os.cpu_count()} cores, {cpu}".rstrip(", "),
        "memory": mem,
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "django": django_version,
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def merge(fresh: list[dict]) -> list[dict]:
    """The previous run's results with these scripts' replaced (for ``--only``)."""
    try:
        previous = json.loads(RESULTS.read_text())
    except (OSError, ValueError):
        return fresh
    by_script = {r["script"]: r for r in previous}
    for r in fresh:
        by_script[r["script"]] = r
    order = [r["script"] for r in previous] + [r["script"] for r in fresh]
    return [by_script[name] for name in dict.fromkeys(order)]


def render(results: list[dict], info: dict[str, str], command: str) -> str:
    """The Markdown that goes between the markers."""
    runs: dict[tuple[str, str], list[str]] = {}
    for r in results:
        key = (r.get("date", info["date"]), r.get("command", command))
        runs.setdefault(key, []).append(r["script"])
    measured = [f"Measured {date} with `{cmd}`" for date, cmd in runs]
    if len(runs) > 1:
        measured = [
            f"Measured {date} with `{cmd}` ({', '.join(names)})"
            for (date, cmd), names in runs.items()
        ]
    lines = [
        "; ".join(measured) + ".",
        "",
        f"- Machine: `{info['uname']}`; {info['cpu']}; {info['memory']} memory",
        f"- Python {info['python'].split()[-1]} ({info['python'].split()[0]}), "
        f"Django {info['django']}",
        "",
        "| benchmark | figure | value | goal | met |",
        "|---|---|---|---|---|",
    ]
    notes: list[str] = []
    for res in results:
        for rep in res.get("reports", []):
            if rep.get("skipped"):
                lines.append(f"| {rep['name']} | skipped: {_cell(rep['skipped'])} | | | |")
                continue
            for fig in rep.get("figures", {}).values():
                met = {True: "yes", False: "**no**", None: ""}[fig.get("met")]
                value = f"{_number(fig.get('value'))} {fig.get('unit', '')}".strip()
                lines.append(
                    f"| {rep['name']} | {_cell(fig.get('label', ''))} | {value} "
                    f"| {_cell(fig.get('goal', ''))} | {met} |"
                )
            notes += [f"{rep['name']}: {n}" for n in rep.get("notes", [])]
        if "raw" in res or res["rc"] != 0:
            state = "failed" if res["rc"] != 0 else "no BENCH_JSON line"
            lines.append(f"| {res['script']} | {state} (exit {res['rc']}), see below | | | |")
    lines.append("")
    lines += [f"- {_cell(n)}" for n in notes]
    for res in results:
        if "raw" in res:
            lines += ["", f"`{res['script']}` output (last lines):", "", "```"]
            lines += res["raw"] + ["```"]
    runtimes = ", ".join(f"{r['script']} {r['seconds']:.0f} s" for r in results)
    lines += ["", f"Run times: {runtimes}."]
    return "\n".join(lines)


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _number(value) -> str:
    if isinstance(value, float):
        if abs(value) >= 100:
            return f"{value:,.0f}"
        return f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return "n/a" if value is None else str(value)


def write(table: str) -> None:
    """Replace the text between the markers in BENCHMARKS.md (adding them if missing)."""
    text = DOC.read_text() if DOC.exists() else "# Benchmarks\n"
    block = f"{START}\n{table}\n{END}"
    pattern = re.compile(re.escape(START) + r".*?" + re.escape(END), re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _m: block, text)
    else:
        text = text.rstrip() + "\n\n## Figures\n\n" + block + "\n"
    DOC.write_text(text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter runs (smoke check)")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these benchmarks")
    parser.add_argument("--no-write", action="store_true", help="do not touch BENCHMARKS.md")
    parser.add_argument("--timeout", type=float, default=420.0, help="seconds per script")
    opts = parser.parse_args()
    via_make = os.environ.get("MAKELEVEL") and not opts.only
    command = "make bench" if via_make and not opts.quick else "python bench/run_all.py"
    if command != "make bench":
        extra = sys.argv[1:]
        command = " ".join(["python bench/run_all.py", *map(shlex.quote, extra)])
    results = []
    t0 = time.monotonic()
    extra_env = services()
    print("services: " + (", ".join(f"{k}={v}" for k, v in extra_env.items()) or "none found"))
    for script in discover(opts.only):
        args = arguments(script, opts.quick)
        if script.stem == "http_load" and "TOOLGATE_TEST_REDIS_URL" in extra_env:
            args += ["--redis", extra_env["TOOLGATE_TEST_REDIS_URL"]]
        results.append(run_one(script, args, opts.timeout, extra_env))
    info = machine()
    for r in results:
        r["date"], r["command"] = info["date"], command
    if opts.only:
        results = merge(results)
    table = render(results, info, command)
    print("\n" + table)
    if not opts.no_write:
        write(table)
        RESULTS.write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n")
        print(f"\nwrote {DOC.relative_to(ROOT)} ({time.monotonic() - t0:.0f} s in all)")
    failed = [r["script"] for r in results if r["rc"] != 0]
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
