"""A scripted agent for ``make demo``: safe tools run at once, risky ones wait for a person.

It gates its risky calls through the public gate API exactly as a real agent
loop would (``new_approval_id``, ``begin_tool_decision``, ``wait_tool_decision``,
``denial_message``). Its tools touch nothing outside a temporary sandbox
folder: "delete" deletes there, "send_email" writes a file there.
"""

from __future__ import annotations

import json
import secrets
import shutil
import signal
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from approvals import gate
from approvals import listener as approvals_listener


@dataclass(frozen=True)
class Call:
    tool: str
    arguments: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Step:
    thought: str
    #: The calls, or a function of what happened so far that returns them.
    calls: tuple[Call, ...] | Callable[[list[str]], tuple[Call, ...]]


#: Tools that only look: they run without asking.
SAFE_TOOLS = frozenset({"list_files", "read_file"})

#: How the agent sums up a risky call for its report: (if it ran, if it did not).
SUMMARIES = {
    "run_shell": ("Measured the build and log folders.", "Did not measure the folders"),
    "delete_path": ("Removed the stale build folder.", "Left the build folder in place"),
}


def report_calls(done: list[str]) -> tuple[Call, ...]:
    """The last step: write down and send what actually happened."""
    lines = "\n".join(f"- {line}" for line in done) or "- Nothing changed."
    return (
        Call("write_file", {"path": "CHANGELOG.md", "content": f"## Unreleased\n{lines}\n"}),
        Call(
            "send_email",
            {
                "to": ["team@example.com"],
                "subject": "Workspace clean-up",
                "body": f"Hi all,\n\nWhat I did today:\n{lines}\n\n-- your agent",
            },
        ),
    )


SCRIPT = (
    Step("Let me see what is in the project.", (Call("list_files", {"path": "."}),)),
    Step("The notes should say what needs doing.", (Call("read_file", {"path": "notes/todo.md"}),)),
    Step(
        "How much space do the build output and the logs take?",
        (Call("run_shell", {"command": "du -sh build logs", "cwd": "."}),),
    ),
    Step(
        "The build folder is stale; I will remove it.",
        (Call("delete_path", {"path": "build", "recursive": True}),),
    ),
    Step("I will record what I did and tell the team (two calls at once).", report_calls),
)


class Sandbox:
    """The demo's pretend workspace: a temporary folder the tools act on."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="toolgate-demo-"))
        files = {
            "README.md": "# Acme service\nA small web service.\n",
            "notes/todo.md": "- remove the stale build folder\n- update the changelog\n"
            "- email the team when done\n",
            "logs/app.log": "INFO started\n" * 40,
            "build/app.bundle.js": "x" * 48_000,
            "build/app.bundle.js.map": "y" * 96_000,
        }
        for name, text in files.items():
            path = self.root / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def _path(self, name: str) -> Path:
        path = (self.root / name).resolve()
        if path != self.root and self.root not in path.parents:
            raise ValueError(f"{name!r} is outside the workspace")
        return path

    def run(self, call: Call) -> str:
        return getattr(self, f"tool_{call.tool}")(**call.arguments)

    def tool_list_files(self, path: str) -> str:
        base = self._path(path)
        return ", ".join(sorted(p.name + ("/" if p.is_dir() else "") for p in base.iterdir()))

    def tool_read_file(self, path: str) -> str:
        return self._path(path).read_text(encoding="utf-8").strip().replace("\n", " ")

    def tool_run_shell(self, command: str, cwd: str = ".") -> str:
        # Never a real shell: the demo answers the one command it knows.
        sizes = []
        for name in command.split()[2:]:
            target = self._path(name)
            total = sum(f.stat().st_size for f in target.rglob("*")) if target.exists() else 0
            sizes.append(f"{total // 1024}K {name}")
        return "; ".join(sizes) or "(simulated) done"

    def tool_delete_path(self, path: str, recursive: bool = False) -> str:
        target = self._path(path)
        shutil.rmtree(target) if recursive else target.unlink()
        return f"deleted {path} (inside the demo sandbox)"

    def tool_write_file(self, path: str, content: str) -> str:
        self._path(path).write_text(content, encoding="utf-8")
        return f"wrote {len(content)} characters to {path}"

    def tool_send_email(self, to: list, subject: str, body: str) -> str:
        outbox = self._path("outbox")
        outbox.mkdir(exist_ok=True)
        message = outbox / f"{len(list(outbox.iterdir())) + 1}.eml"
        message.write_text(f"To: {', '.join(to)}\nSubject: {subject}\n\n{body}", encoding="utf-8")
        return f"queued to {', '.join(to)} (written to the sandbox outbox, not sent)"


class Command(BaseCommand):
    help = "Run a scripted demo agent whose risky tool calls wait for a person on the inbox page."

    def add_arguments(self, parser):
        parser.add_argument("--username", default="demo", help="whose agent run it is")
        parser.add_argument("--url", default="http://127.0.0.1:8000/approvals/")
        parser.add_argument("--pause", type=float, default=1.5, help="seconds between steps")
        parser.add_argument("--timeout", type=float, default=900, help="seconds a call waits")
        parser.add_argument("--rounds", type=int, default=0, help="stop after N rounds (0: loop)")

    def handle(self, *args: Any, username, url, pause, timeout, rounds, **options) -> None:
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"No user {username!r}: run `manage.py demo_user` first.")
        self.user, self.url, self.pause, self.timeout = user, url, pause, timeout
        self.stop = threading.Event()
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, lambda *_: self.stop.set())
        self.say(f"Demo agent for {username!r}. Risky calls wait for you at {url}")
        try:
            round_no = 0
            while not self.stop.is_set() and (not rounds or round_no < rounds):
                round_no += 1
                self.run_round(round_no)
                if not self.stop.is_set() and (not rounds or round_no < rounds):
                    self.say("Task done. Starting again in a moment ...\n")
                    self.stop.wait(4 * self.pause)
        finally:
            approvals_listener.shutdown()
            self.say("Demo agent stopped.")

    def say(self, text: str) -> None:
        self.stdout.write(f"[agent] {text}")
        self.stdout.flush()

    def run_round(self, round_no: int) -> None:
        session_id = f"demo-{round_no}-{secrets.token_hex(2)}"
        sandbox = Sandbox()
        self.say(f"Task: tidy the workspace and tell the team  (session {session_id})")
        done: list[str] = []
        try:
            for step in SCRIPT:
                if self.stop.wait(self.pause):
                    return
                self.say(f"thinking: {step.thought}")
                calls = step.calls(done) if callable(step.calls) else step.calls
                self.run_step(session_id, calls, sandbox, done)
        finally:
            sandbox.close()

    def run_step(self, session_id: str, calls: tuple, sandbox: Sandbox, done: list) -> None:
        gated = []
        for n, call in enumerate(calls):
            shown = json.dumps(call.arguments, ensure_ascii=False)
            if call.tool in SAFE_TOOLS:
                self.say(f"  {call.tool} {shown} -> {sandbox.run(call)[:100]}")
                continue
            approval_id = gate.new_approval_id()
            slot = gate.begin_tool_decision(
                session_id,
                approval_id,
                tool_name=call.tool,
                arguments=call.arguments,
                user=self.user,
                tool_call_id=f"call_{secrets.token_hex(4)}_{n}",
                timeout=self.timeout,
            )
            self.say(f"  {call.tool} {shown}\n          waiting for your answer ...")
            gated.append((call, slot, approval_id))
        for call, slot, approval_id in gated:
            answer = gate.wait_tool_decision(slot, approval_id, cancel_event=self.stop)
            if self.stop.is_set():
                continue  # stopping: the call is recorded as cancelled
            ran, skipped = SUMMARIES.get(call.tool, ("", ""))
            if answer == "allow":
                self.say(f"  allowed {call.tool}: {sandbox.run(call)}")
                summary = ran
            else:
                message = gate.denial_message(approval_id)
                self.say(f"  {call.tool} not run; the model is told: {message!r}")
                reason = message.partition(" Reason: ")[2] or "not approved"
                summary = skipped and f"{skipped} ({reason})."
            if summary:
                done.append(summary)
