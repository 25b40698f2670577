"""``make demo``: the demo user, the site under daphne, and a demo agent, until Ctrl-C."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _wait_for_port(host: str, port: int, proc: subprocess.Popen, seconds: float = 20) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.1)
    return False


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
    deadline = time.monotonic() + 5
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--no-agent", action="store_true", help="run the site only")
    parser.add_argument("--verbose", action="store_true", help="show daphne's access log")
    args = parser.parse_args()

    # Ctrl-C must work even when started from a shell that ignores SIGINT in
    # background jobs; children then inherit the default disposition too.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    env = {**os.environ, "TOOLGATE_QUIET": "1", "PYTHONUNBUFFERED": "1"}
    env.setdefault("DJANGO_SETTINGS_MODULE", "toolgate_site.settings")
    py = sys.executable
    url = f"http://{args.host}:{args.port}/approvals/"
    procs: list[subprocess.Popen] = []
    try:
        subprocess.run([py, "manage.py", "demo_user", "--url", url], cwd=ROOT, env=env, check=True)
        daphne = [py, "-m", "daphne", "-b", args.host, "-p", str(args.port)]
        if not args.verbose:
            daphne += ["-v", "0"]
        daphne.append("toolgate_site.asgi:application")
        procs.append(subprocess.Popen(daphne, cwd=ROOT, env=env))
        if not _wait_for_port(args.host, args.port, procs[0]):
            print(f"  daphne did not start on {args.host}:{args.port}", file=sys.stderr)
            return 1
        print(f"  toolgate is running at {url}  (Ctrl-C stops everything)\n", flush=True)
        agent_script = ROOT / "toolgate_site/management/commands/run_demo_agent.py"
        if not args.no_agent and agent_script.exists():
            agent = [py, "manage.py", "run_demo_agent", "--url", url]
            procs.append(subprocess.Popen(agent, cwd=ROOT, env=env))
        while procs[0].poll() is None:
            time.sleep(0.5)
        print("  daphne stopped", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\n  stopping ...", flush=True)
        return 0
    except subprocess.CalledProcessError as exc:
        print(f"  {exc}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        _stop(procs)


if __name__ == "__main__":
    sys.exit(main())
