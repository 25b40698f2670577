"""`toolgate-mcp-proxy`: put toolgate between an MCP client and an MCP server.

    toolgate-mcp-proxy --url URL --key KEY [--session-id ID] [--allow-read-only]
        [--upstream-url URL] -- COMMAND [ARGS...]

It serves MCP on its own stdin/stdout, starts COMMAND as the real MCP server (or connects to
a streamable-HTTP server with --upstream-url) and passes everything through, except that
every tools/call waits for a person's decision in toolgate first.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from contextlib import AsyncExitStack
from typing import Any

from . import __version__
from .client import ToolgateClient

__all__ = ["main", "run"]

# The upstream server is a separate, possibly less trusted program: it never sees the key.
_NOT_INHERITED = ("TOOLGATE_KEY",)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="toolgate-mcp-proxy",
        description="An MCP server that asks a person in toolgate before any tool of the real "
        "MCP server (COMMAND, or --upstream-url) runs.",
    )
    env = os.environ
    parser.add_argument(
        "--url",
        default=env.get("TOOLGATE_URL"),
        help="toolgate's agent API (where approvals.urls is mounted); default $TOOLGATE_URL",
    )
    parser.add_argument(
        "--key",
        default=env.get("TOOLGATE_KEY"),
        help="agent key; default $TOOLGATE_KEY (preferred: argv is visible to ps)",
    )
    parser.add_argument(
        "--session-id",
        help="toolgate session for these calls (default: mcp-<client name>-<random>)",
    )
    parser.add_argument(
        "--allow-read-only",
        action="store_true",
        help="let tools annotated readOnlyHint: true run without asking",
    )
    parser.add_argument("--upstream-url", help="a streamable-HTTP MCP server instead of COMMAND")
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="decision timeout per call in seconds (default: the server's)",
    )
    parser.add_argument(
        "--progress-interval",
        type=float,
        default=10.0,
        help="seconds between progress notifications while waiting (default 10)",
    )
    parser.add_argument("--log-level", default="WARNING", help="logging level on stderr")
    parser.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        help="-- COMMAND [ARGS...]: the real MCP server, spoken to over stdio",
    )
    args = parser.parse_args(argv)
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    if not args.url or not args.key:
        parser.error("--url and --key (or TOOLGATE_URL and TOOLGATE_KEY) are required")
    if bool(args.command) == bool(args.upstream_url):
        parser.error("give either -- COMMAND [ARGS...] or --upstream-url, not both or neither")
    return args


async def run(args: argparse.Namespace) -> None:
    """Connect the upstream, then serve the downstream client on stdio until it leaves."""
    import anyio
    import mcp_types as types
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.server.stdio import stdio_server

    from .mcp_gateway import Gateway

    client = ToolgateClient(args.url, args.key)
    gateway = Gateway(
        client,
        session_id=args.session_id,
        allow_read_only=args.allow_read_only,
        decision_timeout=args.timeout,
        progress_interval=args.progress_interval,
    )
    async with AsyncExitStack() as stack:
        stack.push_async_callback(client.aclose)
        transport: Any
        if args.upstream_url:
            transport = streamable_http_client(args.upstream_url)
        else:
            env = {k: v for k, v in os.environ.items() if k not in _NOT_INHERITED}
            params = StdioServerParameters(command=args.command[0], args=args.command[1:], env=env)
            transport = stdio_client(params, errlog=sys.stderr)
        read, write = await stack.enter_async_context(transport)
        upstream = await stack.enter_async_context(
            ClientSession(
                read,
                write,
                message_handler=gateway.relay,
                client_info=types.Implementation(name="toolgate-mcp-proxy", version=__version__),
            )
        )
        initialized = await upstream.initialize()
        gateway.upstream = upstream
        server, options = gateway.server(initialized)
        async with anyio.create_task_group() as tasks:
            gateway.tasks = tasks
            async with stdio_server() as (down_read, down_write):
                await server.run(down_read, down_write, options)
            # Give the last mark_executed reports a moment, then leave.
            tasks.cancel_scope.deadline = anyio.current_time() + 5


def main(argv: Sequence[str] | None = None) -> None:
    """The console script."""
    try:
        import anyio
        import mcp  # noqa: F401
    except ImportError:
        sys.exit("toolgate-mcp-proxy needs the MCP SDK: pip install 'toolgate-client[mcp]'")
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr)
    try:
        anyio.run(run, args)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
