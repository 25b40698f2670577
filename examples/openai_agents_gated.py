"""OpenAI Agents SDK with toolgate: the model wants to delete a file, and a person answers.

Runs offline: a small fake ``Model`` stands in for an LLM, so no API key and
no network. From the project root, after ``python manage.py migrate``::

    python examples/openai_agents_gated.py                    # answers itself: allow
    python examples/openai_agents_gated.py --answer deny --reason "not on a Friday"
    python examples/openai_agents_gated.py --answer page      # you answer at /approvals/
    python examples/openai_agents_gated.py --deferred         # interrupt, then resume
    python examples/openai_agents_gated.py --edit '{"path": "build/cache"}'  # allowed with an edit

``--answer page`` needs the site running alongside (``make demo``) and shows
the call to the ``--user`` (default ``demo``, made by ``make demo``).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "toolgate_site.settings")
os.environ.setdefault("TOOLGATE_QUIET", "1")

import django  # noqa: E402

django.setup()

from _answer import answer_when_pending, parse_args  # noqa: E402
from agents import Agent, ModelResponse, Runner, Usage, set_tracing_disabled  # noqa: E402
from agents.models.interface import Model  # noqa: E402
from openai.types.responses import (  # noqa: E402
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from approvals.integrations.openai_agents import (  # noqa: E402
    aapply_decisions,
    adefer_interruptions,
    gated_function_tool,
)

set_tracing_disabled(True)  # nothing leaves this machine


class OfflineModel(Model):
    """An offline stand-in for an LLM: call the tool once, then report what came back."""

    async def get_response(self, system_instructions, input, *args: Any, **kwargs: Any):
        for item in input if isinstance(input, list) else []:
            if isinstance(item, dict) and item.get("type") == "function_call_output":
                return self._reply(f"The tool said: {item['output']}")
        call = ResponseFunctionToolCall(
            id="fc_1",
            call_id="call_1",
            type="function_call",
            name="delete_file",
            arguments=json.dumps({"path": "/srv/old-logs"}),
        )
        return ModelResponse(output=[call], usage=Usage(), response_id=None)

    def _reply(self, text: str) -> ModelResponse:
        content = [ResponseOutputText(text=text, type="output_text", annotations=[])]
        message = ResponseOutputMessage(
            id="msg_1", type="message", role="assistant", status="completed", content=content
        )
        return ModelResponse(output=[message], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any):
        raise NotImplementedError("this example does not stream")


def delete_file(path: str) -> str:
    """Delete a file (pretend)."""
    print(f"  [tool] deleting {path}")
    return f"deleted {path}"


async def main(args, user: Any, session_id: str) -> None:
    context = {"session_id": session_id, "user": user}
    tool = gated_function_tool(delete_file, defer=args.deferred)
    agent = Agent(name="ops", model=OfflineModel(), tools=[tool])
    answer_when_pending(args, session_id)
    result = await Runner.run(agent, "Tidy up the server", context=context)
    if args.deferred:
        print(f"  [agent] run interrupted: {len(result.interruptions)} call(s) awaiting approval")
        await adefer_interruptions(result, session_id=session_id, user=user)
        state = result.to_state()  # could be saved with state.to_string() and loaded later
        await aapply_decisions(state, session_id=session_id, wait=True)
        result = await Runner.run(agent, state, context=context)
    print(f"  [agent] {result.final_output}")


if __name__ == "__main__":
    asyncio.run(main(*parse_args(__doc__)))
