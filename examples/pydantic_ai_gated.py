"""Pydantic AI with toolgate: the model wants to delete a file, and a person answers.

Runs offline: Pydantic AI's ``FunctionModel`` stands in for an LLM, so no API
key and no network. From the project root, after ``python manage.py migrate``::

    python examples/pydantic_ai_gated.py                      # answers itself: allow
    python examples/pydantic_ai_gated.py --answer deny --reason "not on a Friday"
    python examples/pydantic_ai_gated.py --answer page        # you answer at /approvals/
    python examples/pydantic_ai_gated.py --deferred           # the run ends, then resumes
    python examples/pydantic_ai_gated.py --edit '{"path": "build/cache"}'  # allowed with an edit

``--answer page`` needs the site running alongside (``make demo``) and shows
the call to the ``--user`` (default ``demo``, made by ``make demo``).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "toolgate_site.settings")
os.environ.setdefault("TOOLGATE_QUIET", "1")

import django  # noqa: E402

django.setup()

from _answer import answer_when_pending, parse_args  # noqa: E402
from pydantic_ai import (  # noqa: E402
    Agent,
    DeferredToolRequests,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel  # noqa: E402

from approvals.integrations.pydantic_ai import deferred_results, gated  # noqa: E402


@dataclass
class Deps:
    """What the gate reads from each run: the session and whose run it is."""

    session_id: str
    user: Any = None


def delete_file(path: str) -> str:
    """Delete a file (pretend)."""
    print(f"  [tool] deleting {path}")
    return f"deleted {path}"


def model(messages: list, info: AgentInfo) -> ModelResponse:
    """An offline stand-in for an LLM: call the tool once, then report what came back."""
    for part in messages[-1].parts:
        if isinstance(part, ToolReturnPart):
            return ModelResponse(parts=[TextPart(f"The tool said: {part.content}")])
    return ModelResponse(parts=[ToolCallPart("delete_file", {"path": "/srv/old-logs"})])


def main() -> None:
    args, user, session_id = parse_args(__doc__)
    deps = Deps(session_id, user)
    if not args.deferred:
        agent = Agent(FunctionModel(model), deps_type=Deps, toolsets=[gated([delete_file])])
        answer_when_pending(args, session_id)
        print(f"  [agent] {agent.run_sync('Tidy up the server', deps=deps).output}")
        return

    agent = Agent(
        FunctionModel(model),
        deps_type=Deps,
        output_type=[str, DeferredToolRequests],
        toolsets=[gated([delete_file], defer=True)],
    )
    first = agent.run_sync("Tidy up the server", deps=deps)
    requests = first.output
    print(f"  [agent] run ended with {len(requests.approvals)} call(s) awaiting approval")
    answer_when_pending(args, session_id)  # nobody waits: the row is the record
    results = deferred_results(requests, session_id=session_id, wait=True)
    second = agent.run_sync(
        message_history=first.all_messages(), deferred_tool_results=results, deps=deps
    )
    print(f"  [agent] {second.output}")


if __name__ == "__main__":
    main()
