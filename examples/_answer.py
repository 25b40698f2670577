"""What the examples share: their options, and someone to answer when no person does."""

from __future__ import annotations

import argparse
import json
import secrets
import threading
import time
from typing import Any

from django.contrib.auth import get_user_model
from django.db import connections

from approvals.gate import resolve_tool_decision
from approvals.models import Approval


def parse_args(doc: str | None) -> tuple[argparse.Namespace, Any, str]:
    """The example's options, the user whose run it is, and a fresh session id."""
    parser = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--answer", choices=["allow", "deny", "page"], default="allow")
    parser.add_argument("--reason", default="", help="the reason given with the answer")
    parser.add_argument(
        "--edit",
        type=json.loads,
        default=None,
        help='allow with these arguments instead (JSON, e.g. \'{"path": "build/"}\')',
    )
    parser.add_argument("--deferred", action="store_true", help="end the run, then resume it")
    parser.add_argument("--user", default="demo", help="whose run it is (shown to them)")
    parser.add_argument("--url", default="http://127.0.0.1:8000/approvals/")
    args = parser.parse_args()
    user = get_user_model().objects.filter(username=args.user).first()
    session_id = f"example-{secrets.token_hex(3)}"
    print(f"  [example] session {session_id}, user {user or '(none)'}")
    return args, user, session_id


def answer_when_pending(args: argparse.Namespace, session_id: str) -> None:
    """Answer the session's pending call from another thread, or ask a person to."""
    if args.answer == "page":
        print(f"  [example] answer the call at {args.url}?session_id={session_id}")
        return

    def answer() -> None:
        try:
            for _ in range(500):
                row = Approval.objects.filter(session_id=session_id, status="pending").first()
                if row is not None:
                    time.sleep(0.5)  # long enough to see it on the page
                    edit = args.edit if args.answer == "allow" else None
                    resolve_tool_decision(
                        row.approval_id, args.answer, reason=args.reason, arguments=edit
                    )
                    shown = row.arguments if edit is None else f"{row.arguments} edited to {edit}"
                    print(f"  [person] {args.answer} {row.tool_name} {shown}")
                    return
                time.sleep(0.02)
        finally:
            connections.close_all()

    threading.Thread(target=answer, daemon=True).start()
