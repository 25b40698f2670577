"""``make demo``: the demo user, the site under daphne, and a demo agent, until Ctrl-C."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--no-agent", action="store_true", help="run the site only")
    args = parser.parse_args()

    env = {**os.environ, "TOOLGATE_QUIET": "1", "PYTHONUNBUFFERED": "1"}
    env.setdefault("DJANGO_SETTINGS_MODULE", "toolgate_site.settings")
    py = sys.executable
    url = f"http://{args.host}:{args.port}/approvals/"
    subprocess.run([py, "manage.py", "demo_user", "--url", url], cwd=ROOT, env=env, check=True)

    procs: list[subprocess.Popen] = []
    daphne = [py, "-m", "daphne", "-b", args.host, "-p", str(args.port)]
    procs.append(subprocess.Popen([*daphne, "toolgate_site.asgi:application"], cwd=ROOT, env=env))
    if (
        not args.no_agent
        and (ROOT / "toolgate_site/management/commands/run_demo_agent.py").exists()
    ):
        time.sleep(1.0)
        procs.append(subprocess.Popen([py, "manage.py", "run_demo_agent"], cwd=ROOT, env=env))
    print(f"\n  toolgate is running at {url}  (Ctrl-C stops everything)\n", flush=True)

    def stop(*_args: object) -> None:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 5
        for p in procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()

    signal.signal(signal.SIGTERM, lambda *a: (stop(), sys.exit(0)))
    try:
        while all(p.poll() is None for p in procs[:1]):
            time.sleep(0.5)
    except KeyboardInterrupt:
        print("\n  stopping ...", flush=True)
    finally:
        stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
