"""bench/changelist.py writes its rows with raw SQL, so a new NOT NULL column breaks it
without any other test noticing: build a small table with it and render the changelist."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_changelist_benchmark_builds_its_rows_and_renders(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env["PYTHONPATH"] = str(ROOT)
    db = tmp_path / "changelist.sqlite3"
    done = subprocess.run(
        [sys.executable, "bench/changelist.py", "--rows", "500", "--runs", "1", "--db", str(db)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("BENCH_JSON "))
    figures = json.loads(line.removeprefix("BENCH_JSON "))["figures"]
    assert figures["search_id_p50"]["value"] > 0
    assert figures["pending_queries"]["value"] >= 1
