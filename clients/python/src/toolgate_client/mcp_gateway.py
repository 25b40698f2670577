"""The MCP gateway: an MCP server that forwards everything to an upstream MCP server, and asks
toolgate before every `tools/call`.

The upstream is reached through the SDK's `ClientSession`; the downstream client is served
by the SDK's lowlevel `Server`. Only the handlers, the notification relay and the gate live
here; the transports are chosen by `mcp_proxy`.
"""

from __future__ import annotations

import logging
import secrets
from typing import Any

import anyio
import anyio.abc
import mcp_types as types
from mcp.client.session import ClientSession, IncomingMessage
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.server.models import InitializationOptions
from mcp.server.session import ServerSession
from pydantic import BaseModel

from .client import ToolgateClient
from .protocol import Decision

__all__ = ["Gateway"]

logger = logging.getLogger("toolgate_client.mcp")

Ctx = ServerRequestContext[Any, Any]
DESCRIPTION_LIMIT = 2000


class Gateway:
    """One downstream client, one upstream server, one toolgate session.

    `session_id` is the toolgate session the calls are gated under; ``None`` makes one from
    the downstream client's name (`mcp-<name>-<random>`) at the first call. With
    `allow_read_only`, tools annotated ``readOnlyHint: true`` run without asking.
    `progress_interval` is how often a waiting call reports progress, when its request
    carried a progress token.
    """

    def __init__(
        self,
        client: ToolgateClient,
        *,
        session_id: str | None = None,
        allow_read_only: bool = False,
        decision_timeout: float | None = None,
        progress_interval: float = 10.0,
    ) -> None:
        self.client = client
        self.session_id = session_id
        self.allow_read_only = allow_read_only
        self.decision_timeout = decision_timeout
        self.progress_interval = progress_interval
        self.upstream: ClientSession | None = None
        self.downstream: ServerSession | None = None
        self.tasks: anyio.abc.TaskGroup | None = None
        self.tools: dict[str, types.Tool] = {}

    # -- wiring -------------------------------------------------------------------------

    def server(self, upstream: types.InitializeResult) -> tuple[Server[Any], InitializationOptions]:
        """The downstream server and the `initialize` answer, both mirroring the upstream."""
        caps = upstream.capabilities
        handlers: dict[str, Any] = {}
        if caps.tools is not None:
            handlers |= {"on_list_tools": self._list_tools, "on_call_tool": self._call_tool}
        if caps.resources is not None:
            handlers |= {
                "on_list_resources": self._forwarder(types.ListResourcesRequest),
                "on_list_resource_templates": self._forwarder(types.ListResourceTemplatesRequest),
                "on_read_resource": self._forwarder(types.ReadResourceRequest),
            }
            if caps.resources.subscribe:
                handlers |= {
                    "on_subscribe_resource": self._forwarder(types.SubscribeRequest),
                    "on_unsubscribe_resource": self._forwarder(types.UnsubscribeRequest),
                }
        if caps.prompts is not None:
            handlers |= {
                "on_list_prompts": self._forwarder(types.ListPromptsRequest),
                "on_get_prompt": self._forwarder(types.GetPromptRequest),
            }
        if caps.completions is not None:
            handlers["on_completion"] = self._forwarder(types.CompleteRequest)
        info = upstream.server_info
        server: Server[Any] = Server(
            info.name, version=info.version, instructions=upstream.instructions, **handlers
        )
        if caps.logging is not None:
            server.add_request_handler(
                "logging/setLevel",
                types.SetLevelRequestParams,
                self._forwarder(types.SetLevelRequest),
            )
        server.add_notification_handler(
            "notifications/initialized", types.NotificationParams, self._initialized
        )
        options = InitializationOptions(
            server_name=info.name,
            server_version=info.version,
            title=info.title,
            description=info.description,
            website_url=info.website_url,
            icons=info.icons,
            instructions=upstream.instructions,
            # Mirrored, minus what the gateway does not carry (experimental, extensions, tasks).
            capabilities=types.ServerCapabilities(
                tools=caps.tools,
                resources=caps.resources,
                prompts=caps.prompts,
                logging=caps.logging,
                completions=caps.completions,
            ),
        )
        return server, options

    async def relay(self, message: IncomingMessage) -> None:
        """The upstream's notifications, passed on to the downstream client."""
        if isinstance(message, Exception):
            logger.warning("upstream transport error: %s", message)
            return
        if isinstance(message, types.ToolListChangedNotification):
            self.tools.clear()
        if isinstance(message, types.ProgressNotification | types.CancelledNotification):
            return  # progress of forwarded calls goes through their own callback
        if self.downstream is None:
            logger.debug("dropped %s: the downstream client has not initialized", message)
            return
        await self.downstream.send_notification(message)

    async def _initialized(self, ctx: Ctx, params: types.NotificationParams) -> None:
        self.downstream = ctx.session

    def _up(self, ctx: Ctx) -> ClientSession:
        if self.downstream is None:
            self.downstream = ctx.session
        assert self.upstream is not None, "the gateway runs only once the upstream is connected"
        return self.upstream

    def _forwarder(self, request_type: type[Any]) -> Any:
        result_type = _RESULTS[request_type]

        async def forward(ctx: Ctx, params: BaseModel | None) -> BaseModel:
            request = request_type(params=_without_progress(params))
            return await self._up(ctx).send_request(request, result_type)

        return forward

    # -- tools --------------------------------------------------------------------------

    async def _list_tools(
        self, ctx: Ctx, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        result = await self._up(ctx).send_request(
            types.ListToolsRequest(params=_without_progress(params)), types.ListToolsResult
        )
        self.tools.update((tool.name, tool) for tool in result.tools)
        return result

    async def _call_tool(
        self, ctx: Ctx, params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        tool = await self._tool(ctx, params.name)
        read_only = bool(tool and tool.annotations and tool.annotations.read_only_hint)
        if self.allow_read_only and read_only:
            return await self._run(ctx, params, params.arguments, ticks=0)
        decision, ticks = await self._ask(ctx, params, tool)
        if not decision.allowed:
            text = decision.message or "The tool call did not run."
            return types.CallToolResult(
                content=[types.TextContent(type="text", text=text)], is_error=True
            )
        try:
            result = await self._run(ctx, params, decision.arguments, ticks=ticks)
        except Exception as exc:
            self._report(decision.approval_id, ok=False, summary=f"{type(exc).__name__}: {exc}")
            raise
        # Only an error's text goes to the audit row; a result may hold what it should not.
        summary = _summary(result) if result.is_error else ""
        self._report(decision.approval_id, ok=not result.is_error, summary=summary)
        return result

    async def _tool(self, ctx: Ctx, name: str) -> types.Tool | None:
        """The tool's listing (description, schema, annotations), listing upstream if need be."""
        if name not in self.tools:
            cursor: str | None = None
            for _ in range(100):
                params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
                page = await self._list_tools(ctx, params)
                cursor = page.next_cursor
                if name in self.tools or not cursor:
                    break
        return self.tools.get(name)

    async def _ask(
        self, ctx: Ctx, params: types.CallToolRequestParams, tool: types.Tool | None
    ) -> tuple[Decision, int]:
        """Gate the call; while waiting, tick progress when the request asked for it."""
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await anyio.sleep(self.progress_interval)
                ticks += 1
                try:
                    await ctx.session.report_progress(
                        ticks, message=f"Waiting for a person to allow or deny {params.name}"
                    )
                except Exception as exc:  # progress is a courtesy; the wait goes on
                    logger.debug("progress notification not sent: %s", exc)

        async with anyio.create_task_group() as group:
            if _progress_token(ctx) is not None:
                group.start_soon(tick)
            decision = await self.client.arequest_tool_decision(
                self._session_id(ctx),
                params.name,
                params.arguments or {},
                tool_call_id="" if ctx.request_id is None else str(ctx.request_id),
                timeout=self.decision_timeout,
                description=((tool.description or "") if tool else "")[:DESCRIPTION_LIMIT],
                editable=True,
                arguments_schema=tool.input_schema if tool else None,
            )
            group.cancel_scope.cancel()
        return decision, ticks

    async def _run(
        self,
        ctx: Ctx,
        params: types.CallToolRequestParams,
        arguments: dict[str, Any] | None,
        *,
        ticks: int,
    ) -> types.CallToolResult:
        """Forward the call upstream; its progress continues after the waiting ticks."""
        on_progress = None
        if _progress_token(ctx) is not None:

            async def on_progress(
                progress: float, total: float | None, message: str | None
            ) -> None:
                # Progress must only grow: the upstream's count starts after our ticks.
                await ctx.session.report_progress(
                    ticks + progress, None if total is None else ticks + total, message
                )

        forwarded = params.model_copy(
            update={"arguments": arguments, "meta": _meta_without_progress(params.meta)}
        )
        return await self._up(ctx).send_request(
            types.CallToolRequest(params=forwarded),
            types.CallToolResult,
            progress_callback=on_progress,
        )

    def _report(self, approval_id: str, *, ok: bool, summary: str) -> None:
        async def report() -> None:
            try:
                await self.client.amark_executed(approval_id, ok=ok, summary=summary)
            except Exception as exc:  # the result is already on its way; never fail it
                logger.warning("could not report %s as executed: %s", approval_id, exc)

        # In the background: the result goes back now, not after toolgate answered.
        if self.tasks is not None:
            self.tasks.start_soon(report)

    def _session_id(self, ctx: Ctx) -> str:
        if self.session_id is None:
            params = ctx.session.client_params
            name = params.client_info.name if params is not None else "client"
            cleaned = "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in name)[:40]
            self.session_id = f"mcp-{cleaned or 'client'}-{secrets.token_hex(4)}"
        return self.session_id


_RESULTS: dict[type[Any], type[BaseModel]] = {
    types.ListResourcesRequest: types.ListResourcesResult,
    types.ListResourceTemplatesRequest: types.ListResourceTemplatesResult,
    types.ReadResourceRequest: types.ReadResourceResult,
    types.SubscribeRequest: types.EmptyResult,
    types.UnsubscribeRequest: types.EmptyResult,
    types.ListPromptsRequest: types.ListPromptsResult,
    types.GetPromptRequest: types.GetPromptResult,
    types.CompleteRequest: types.CompleteResult,
    types.SetLevelRequest: types.EmptyResult,
}


def _progress_token(ctx: Ctx) -> Any:
    return (ctx.meta or {}).get("progress_token")


def _meta_without_progress(meta: Any) -> Any:
    # The downstream's token means nothing upstream; the SDK sets its own when we ask.
    if not meta:
        return meta
    rest = {k: v for k, v in meta.items() if k not in ("progress_token", "progressToken")}
    return rest or None


def _without_progress(params: Any) -> Any:
    if params is None or not getattr(params, "meta", None):
        return params
    return params.model_copy(update={"meta": _meta_without_progress(params.meta)})


def _summary(result: types.CallToolResult) -> str:
    texts = [block.text for block in result.content if isinstance(block, types.TextContent)]
    return " ".join(texts)[:500]
