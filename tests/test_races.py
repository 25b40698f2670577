"""Races on PostgreSQL: 8 processes decide one call at the same instant, 200 times.

Each trial gates one call here (a waiting thread in this process), then eight
long-lived worker processes fire at one shared instant (each door setting off
early by most of its usual round trip, so they meet at the database), each through one of
the four doors, two per door, shuffled every trial: HTTP and WebSocket through
a real daphne process, the admin action (``post=yes``) through Django's test
client in the worker, and the Python API. Every decider is a different user,
so the audit row names the winner. Per trial: exactly one worker is told it
won, the waiter gets the winner's answer, the row says the winner's decision,
door and user, and ``approval_decided`` fired exactly once across all
processes (a receiver in every process appends to one file).

Runs in ``make test-services`` (PostgreSQL and Redis); skipped elsewhere.
"""

from __future__ import annotations

import json
import os
import queue
import random
import subprocess
import sys
import threading
import time

import pytest
from django.contrib.auth.models import Permission
from django.db import connection
from django.test import Client

from approvals import gate
from approvals.models import Approval

from .conftest import ROOT
from .procs import start_daphne, wait_ready

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.postgres,
    pytest.mark.redis,
    pytest.mark.slow,
    pytest.mark.skipif(
        not os.environ.get("TOOLGATE_TEST_DATABASE_URL"),
        reason="set TOOLGATE_TEST_DATABASE_URL (PostgreSQL) to run; .ci/run does",
    ),
    pytest.mark.skipif(
        not os.environ.get("TOOLGATE_TEST_REDIS_URL"),
        reason="set TOOLGATE_TEST_REDIS_URL (Redis) to run; .ci/run does",
    ),
]

WORKER = "import django; django.setup(); from tests.test_races import worker_main; worker_main()"
TRIALS = int(os.environ.get("TOOLGATE_RACE_TRIALS", "200"))
DOORS = ["http", "http", "ws", "ws", "admin", "admin", "api", "api"]
VIA = {"http": "web", "ws": "websocket", "admin": "admin", "api": "api"}
STATUS = {"allow": "allowed", "deny": "denied"}
# Every process (daphne, workers) counts approval_decided into one file.
_SETTINGS = """import os as _os
from toolgate_site.settings import *  # noqa: F403
from approvals.signals import approval_decided as _decided


def _count(sender, approval, **kwargs):
    with open(_os.environ["TOOLGATE_RACE_SIGNALS"], "a") as fh:
        fh.write(f"{approval.approval_id} {_os.getpid()}\\n")


_decided.connect(_count, weak=False, dispatch_uid="toolgate-race-count")
"""


@pytest.fixture
def race_env(child_env, tmp_path):
    if connection.vendor != "postgresql":
        pytest.skip("runs in make test-services (the session database is not PostgreSQL)")
    if "REDIS_URL" not in os.environ:
        pytest.skip("runs in make test-services (the channel layer is not Redis)")
    (tmp_path / "toolgate_race_settings.py").write_text(_SETTINGS)
    signals = tmp_path / "signals.txt"
    signals.touch()
    env = {**child_env, "DJANGO_SETTINGS_MODULE": "toolgate_race_settings"}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT), env.get("PYTHONPATH", "")])
    env["TOOLGATE_RACE_SIGNALS"] = str(signals)
    env["PYTHONUNBUFFERED"] = "1"
    return env, signals


class Worker:
    """One long-lived decider process, fed trials as JSON lines."""

    def __init__(self, env: dict, init: dict) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WORKER],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.send(init)

    def _read(self) -> None:
        for raw in self.proc.stdout:
            try:
                self.lines.put(json.loads(raw))
            except ValueError:
                continue
        self.lines.put({"event": "exit"})

    def send(self, message: dict) -> None:
        self.proc.stdin.write(json.dumps(message) + "\n")
        self.proc.stdin.flush()

    def next(self, timeout: float = 30.0) -> dict:
        line = self.lines.get(timeout=timeout)
        if line.get("event") in ("exit", "error"):
            raise RuntimeError(f"race worker: {line}")
        return line

    def stop(self) -> None:
        try:
            self.send({"op": "quit"})
            self.proc.wait(10)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait(5)


def _deciders(django_user_model, count: int) -> list:
    perms = Permission.objects.filter(codename__in=["decide_approval", "view_approval"])
    users = []
    for i in range(count):
        user = django_user_model.objects.create_user(f"decider{i}", is_staff=True)
        user.user_permissions.add(*perms)
        client = Client()
        client.force_login(user)
        users.append((user, client.cookies["sessionid"].value))
    return users


def test_eight_processes_racing_through_four_doors_one_winner_every_trial(
    race_env, django_user_model
):
    env, signals = race_env
    owner = django_user_model.objects.create_user("owner")
    deciders = _deciders(django_user_model, len(DOORS))
    server = wait_ready(start_daphne(env))
    workers: list[Worker] = []
    try:
        for user, sessionid in deciders:
            init = {"port": server.port, "sessionid": sessionid, "username": user.username}
            workers.append(Worker(env, init))
        for w in workers:
            assert w.next(60)["event"] == "ready"
        won_by = [_trial(workers, deciders, owner, n) for n in range(TRIALS)]
    finally:
        for w in workers:
            w.stop()
        server.stop()
    aids = [aid for aid, _ in won_by]
    counts: dict[str, int] = {}
    for line in signals.read_text().splitlines():
        counts[line.split()[0]] = counts.get(line.split()[0], 0) + 1
    assert {aid: counts.get(aid, 0) for aid in aids} == dict.fromkeys(aids, 1)
    tally = {door: sum(d == door for _, d in won_by) for door in VIA}
    print(f"winning doors over {TRIALS} trials: {tally}")
    if TRIALS >= 100:  # the doors really raced: not one door winning every time
        assert sum(count > 0 for count in tally.values()) >= 3, tally


def _trial(workers: list[Worker], deciders: list, owner, n: int) -> tuple[str, str]:
    aid = gate.new_approval_id()
    slot = gate.begin_tool_decision(f"race-{n}", aid, user=owner, tool_name="shell")
    box: dict = {}
    waiter = threading.Thread(target=lambda: box.update(answer=gate.wait_tool_decision(slot, aid)))
    waiter.start()
    doors = random.sample(DOORS, len(DOORS))
    answers = [random.choice(["allow", "deny"]) for _ in workers]
    at = time.monotonic() + 0.1  # every worker has prepared (and set off) by then
    for w, door, answer in zip(workers, doors, answers, strict=True):
        w.send({"op": "race", "aid": aid, "door": door, "decision": answer, "at": at})
    results = [w.next() for w in workers]
    waiter.join(10)
    winners = [i for i, r in enumerate(results) if r["won"]]
    assert len(winners) == 1, (n, results)
    i = winners[0]
    row = Approval.objects.values("status", "decided_via", "decided_by__username").get(
        approval_id=aid
    )
    assert box.get("answer") == answers[i], (n, box, results)
    assert row == {
        "status": STATUS[answers[i]],
        "decided_via": VIA[doors[i]],
        "decided_by__username": deciders[i][0].username,
    }, (n, row, doors[i], results)
    return aid, doors[i]


# -- the worker process ----------------------------------------------------------


def worker_main() -> None:
    """A decider process: JSON lines in (``race``, ``quit``), JSON lines out."""
    init = json.loads(sys.stdin.readline())
    fire = _doors(init)
    took: dict[str, list[float]] = {door: [] for door in fire}
    _emit(event="ready", pid=os.getpid())
    for raw in sys.stdin:
        command = json.loads(raw)
        if command.get("op") == "quit":
            break
        door = command["door"]
        try:
            shoot = fire[door](command["aid"], command["decision"])
            # A slow door (HTTP) sets off earlier than a fast one (the API), by most of
            # its usual round trip, so the decisions meet at the database: a real race.
            recent = sorted(took[door][-15:])
            lead = recent[len(recent) // 2] * 0.7 if recent else 0.0
            lead += random.uniform(-0.002, 0.002)
            time.sleep(max(0.0, command["at"] - lead - time.monotonic()))
            t0 = time.monotonic()
            won = shoot()
            took[door].append(time.monotonic() - t0)
        except Exception as exc:  # reported, and the trial fails loudly
            _emit(event="error", detail=repr(exc))
            continue
        _emit(event="result", aid=command["aid"], door=door, won=won)


def _emit(**fields) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def _doors(init: dict) -> dict:
    """For each door, a function that prepares a decision and returns the one that fires it."""
    from django.contrib.auth import get_user_model
    from django.contrib.messages import get_messages
    from websockets.sync.client import connect

    from .procs import HttpClient, Server, ws_headers

    user = get_user_model().objects.get(username=init["username"])
    server = Server(None, f"http://127.0.0.1:{init['port']}", init["port"])
    http = HttpClient(server, init["sessionid"])
    sock = connect(
        server.ws_url,
        additional_headers=ws_headers(server, init["sessionid"]),
        proxy=None,
        open_timeout=10,
    )
    assert json.loads(sock.recv(timeout=10))["type"] == "snapshot"
    admin = Client(HTTP_HOST="localhost")
    admin.force_login(user)

    def by_http(aid: str, decision: str):
        return lambda: (
            http.post_json(
                "/api/inference/tool-confirm", {"approval_id": aid, "decision": decision}
            )[0]
            == 200
        )

    def by_ws(aid: str, decision: str):
        message = json.dumps({"type": "tool_confirm", "approval_id": aid, "decision": decision})

        def shoot() -> bool:
            sock.send(message)
            while True:
                reply = json.loads(sock.recv(timeout=10))
                if reply["type"] == "tool_confirm_result" and reply["approval_id"] == aid:
                    return reply["resolved"]

        return shoot

    def by_admin(aid: str, decision: str):
        pk = Approval.objects.values_list("pk", flat=True).get(approval_id=aid)
        form = {"action": f"{decision}_selected", "_selected_action": [pk], "post": "yes"}

        def shoot() -> bool:
            admin.cookies.pop("messages", None)  # only this request's messages count
            response = admin.post("/admin/approvals/approval/", form)  # no follow: just decide
            said = " ".join(str(m) for m in get_messages(response.wsgi_request))
            assert "Decided" in said, said
            return "Decided 1," in said

        return shoot

    def by_api(aid: str, decision: str):
        return lambda: gate.resolve_tool_decision(aid, decision, user=user)

    return {"http": by_http, "ws": by_ws, "admin": by_admin, "api": by_api}
