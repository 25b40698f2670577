"""The real MCP server behind the proxy in the tests, written with the SDK's MCPServer.

Every real execution of a tool appends a line to the file named by $UPSTREAM_LOG, so a test
can tell "ran once" from "never ran". Run as a script it serves stdio.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import ToolAnnotations


def build(log_path: str | os.PathLike[str]) -> MCPServer:
    log = Path(log_path)
    server = MCPServer("notes-upstream", version="1.2.3", instructions="Keeps notes.")

    def record(tool: str, **arguments: object) -> None:
        with log.open("a") as f:
            f.write(json.dumps({"tool": tool, **arguments}) + "\n")

    @server.tool(description="Append a note to the notebook.")
    def write_note(text: str, tag: str = "") -> str:
        record("write_note", text=text, tag=tag)
        return f"saved: {text}"

    @server.tool(description="Read the notebook.", annotations=ToolAnnotations(read_only_hint=True))
    def read_notes() -> str:
        record("read_notes")
        return "no notes yet"

    @server.tool(description="Fails on purpose.")
    def broken() -> str:
        record("broken")
        raise ValueError("it broke")

    @server.tool(description="Counts to three, reporting progress.")
    async def count(ctx: Context) -> str:
        record("count")
        for step in (1, 2, 3):
            await ctx.report_progress(step, 3, f"step {step}")
        return "counted"

    @server.resource("notes://readme", description="About the notebook.")
    def readme() -> str:
        return "A notebook."

    @server.prompt(description="Ask for a summary.")
    def summarize(topic: str) -> str:
        return f"Summarize the notes about {topic}."

    return server


if __name__ == "__main__":
    build(os.environ["UPSTREAM_LOG"]).run("stdio")
