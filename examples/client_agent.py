"""An agent outside Django that asks toolgate before each tool call, over HTTP.

Needs only the client (``pip install ./clients/python``) and a running toolgate with an
agent key (``python manage.py approvals_agent_key create --user demo --name laptop``)::

    python examples/client_agent.py --url http://127.0.0.1:8000/api/inference/ --key KEY

Then allow, deny or edit the calls at http://127.0.0.1:8000/approvals/. The "tools" only
print what they would do; the agent runs the arguments the person approved.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

try:
    from toolgate_client import ToolgateClient, ToolgateError
except ImportError:  # run from a checkout without installing the client
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "clients" / "python" / "src"))
    from toolgate_client import ToolgateClient, ToolgateError

TOOLS: dict[str, dict[str, Any]] = {
    "write_file": {
        "type": "object",
        "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
        "required": ["path", "content"],
        "additionalProperties": False,
    },
    "send_email": {
        "type": "object",
        "properties": {"to": {"type": "string"}, "subject": {"type": "string"}},
        "required": ["to", "subject"],
        "additionalProperties": False,
    },
}

PLAN: list[tuple[str, dict[str, Any], str]] = [
    ("write_file", {"path": "/tmp/report.txt", "content": "Q3: fine"}, "Save the report."),
    ("send_email", {"to": "boss@example.com", "subject": "Q3 report"}, "Tell the boss."),
]


def run_tool(name: str, arguments: dict[str, Any]) -> str:
    return f"(pretend) {name}({arguments})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=os.environ.get("TOOLGATE_URL"), required=False)
    parser.add_argument("--key", default=os.environ.get("TOOLGATE_KEY"), required=False)
    parser.add_argument("--session-id", default="client-agent-demo")
    parser.add_argument("--timeout", type=float, default=600, help="decision timeout, seconds")
    args = parser.parse_args()
    if not args.url or not args.key:
        parser.error("--url and --key (or TOOLGATE_URL and TOOLGATE_KEY) are required")

    with ToolgateClient(args.url, args.key) as toolgate:
        for number, (tool, arguments, why) in enumerate(PLAN, 1):
            print(f"asking to run {tool} {arguments} ... (decide in the inbox)")
            try:
                decision = toolgate.request_tool_decision(
                    args.session_id,
                    tool,
                    arguments,
                    tool_call_id=f"call-{number}",
                    timeout=args.timeout,
                    description=why,
                    editable=True,
                    arguments_schema=TOOLS[tool],
                )
            except ToolgateError as exc:
                print(f"toolgate refused the request: {exc}", file=sys.stderr)
                return 1
            if not decision.allowed:
                print(f"not run ({decision.status}): {decision.message}")
                continue
            try:
                output = run_tool(tool, decision.arguments)
            except Exception as exc:
                toolgate.mark_executed(decision.approval_id, ok=False, summary=str(exc))
                raise
            toolgate.mark_executed(decision.approval_id, ok=True, summary=output[:200])
            print(f"ran: {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
