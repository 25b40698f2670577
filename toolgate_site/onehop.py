"""Django's ASGI handler, serving a synchronous view's whole request in one thread hop.

Under ASGI, Django builds its middleware chain in async mode. Middleware
written the classic way (``MiddlewareMixin``: all of Django's own) then runs
each ``process_request``, ``process_view`` and ``process_response`` through a
``sync_to_async`` of its own: with this site's middleware and a synchronous
view, 16 or 17 hand-offs between the event loop and a request thread per
request, each a future, a queue, a wake-up and the interpreter lock
changing hands. On one daphne process those hand-offs cost more than
everything else a trivial request does (bench/request_parts.py).

:class:`OneHopASGIHandler` keeps a second chain of the same middleware, built
in sync mode as Django builds it under WSGI, and runs it with the view in one
``sync_to_async`` call when the path resolves to a synchronous view; the
``request_started`` and ``request_finished`` receivers run in that same call
(Django hands each over on its own), so such a request is one hand-off. Django's
own async chain still serves everything else: async views, paths no view
matches, and the static files. The middleware are the same classes in the
same order, so every check (sessions, CSRF, authentication, security headers)
runs as before; only where the event loop hands over changes.

Middleware that can only run async cannot join a sync chain. The one this
site has, ``ServeStaticMiddleware``, answers nothing outside its static prefix
(unless ``SERVESTATIC_ROOT`` or ``SERVESTATIC_INDEX_FILE`` make it serve other
paths), so the sync chain leaves it out and requests under that prefix take
the async chain. With any other async-only middleware configured, every
request takes Django's async chain, as with Django's own handler.
"""

from __future__ import annotations

from urllib.parse import urlparse

from asgiref.sync import iscoroutinefunction, sync_to_async
from django.conf import settings
from django.core import signals
from django.core.exceptions import ImproperlyConfigured, MiddlewareNotUsed, RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.core.handlers.base import BaseHandler
from django.core.handlers.exception import convert_exception_to_response
from django.http import FileResponse
from django.urls import Resolver404, get_resolver, set_script_prefix
from django.utils.module_loading import import_string

SERVESTATIC = "servestatic.middleware.ServeStaticMiddleware"
#: How many paths' answers :meth:`OneHopASGIHandler.one_hop` keeps (then it starts over).
PATHS_KEPT = 2048


class OneHopASGIHandler(ASGIHandler):
    """``ASGIHandler`` that serves synchronous views with one thread hop."""

    def __init__(self) -> None:
        super().__init__()
        paths, self.async_prefixes = _sync_middleware(list(settings.MIDDLEWARE))
        self.sync_handler: BaseHandler | None = None
        self._paths: dict[tuple, bool] = {}
        if paths is not None:
            self.sync_handler = BaseHandler()
            _load_sync(self.sync_handler, paths)

    def one_hop(self, path: str) -> bool:
        """Whether ``path`` is served by the sync chain (a synchronous view)."""
        if self.sync_handler is None or path.startswith(self.async_prefixes):
            return False
        resolver = get_resolver()
        key = (resolver, path)
        known = self._paths.get(key)
        if known is None:
            try:
                known = not iscoroutinefunction(resolver.resolve(path).func)
            except Resolver404:
                known = False
            if len(self._paths) >= PATHS_KEPT:
                self._paths.clear()
            self._paths[key] = known
        return known

    async def handle(self, scope, receive, send):
        """Serve a synchronous view's request with one hand-off; the rest as Django does.

        In the one hand-off, in Django's order: ``request_started``, the request
        object, the middleware and the view, and (for a response that is not
        streamed) ``response.close()``, which sends ``request_finished``. The
        event loop then only writes the answer. A streamed response is closed
        after its body is sent, as Django does. Django also listens for the
        client going away meanwhile, to cancel an async view; a synchronous view
        runs to its end either way, so here an answer nobody waits for any more
        is dropped.
        """
        if not self.one_hop(_path_info(scope)):
            return await super().handle(scope, receive, send)
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        try:
            set_script_prefix(get_script_prefix(scope))
            response = await sync_to_async(self._serve, thread_sensitive=True)(scope, body_file)
            try:
                await self.send_response(response, send)
            except OSError:
                pass  # the client went away (ASGI servers may say so this way)
            finally:
                if response.streaming:
                    await sync_to_async(response.close)()
        finally:
            body_file.close()

    def _serve(self, scope, body_file):
        """The request thread's part of :meth:`handle`: the response to send."""
        signals.request_started.send(sender=self.__class__, scope=scope)
        request, response = self.create_request(scope, body_file)
        if request is not None:
            response = self.sync_handler.get_response(request)
            response._handler_class = self.__class__
            if isinstance(response, FileResponse):
                response.block_size = self.chunk_size
        if not response.streaming:
            response.close()  # its content is in memory; this sends request_finished
        return response


def _path_info(scope: dict) -> str:
    """The request's ``path_info``, as ``ASGIRequest`` derives it from the scope."""
    script = get_script_prefix(scope)
    return scope["path"].removeprefix(script) if script else scope["path"]


def _sync_middleware(paths: list[str]) -> tuple[list[str] | None, tuple[str, ...]]:
    """The middleware of the sync chain and the path prefixes it must leave to the
    async chain; ``None`` when some middleware can run only async and may answer
    any path."""
    kept: list[str] = []
    prefixes: list[str] = []
    for dotted in paths:
        middleware = import_string(dotted)
        if getattr(middleware, "sync_capable", True):
            kept.append(dotted)
            continue
        prefix = _static_prefix(middleware)
        if prefix is None:
            return None, ()
        prefixes.append(prefix)
    return kept, tuple(prefixes)


def _static_prefix(middleware: type) -> str | None:
    """The only paths ServeStatic may answer, or ``None`` (not ServeStatic, or it
    also serves a root folder or index files)."""
    try:
        servestatic = import_string(SERVESTATIC)
    except ImportError:
        return None
    if not issubclass(middleware, servestatic):
        return None
    if getattr(settings, "SERVESTATIC_ROOT", None) or getattr(
        settings, "SERVESTATIC_INDEX_FILE", None
    ):
        return None
    prefix = getattr(settings, "SERVESTATIC_STATIC_PREFIX", None)
    if prefix is None:
        prefix = urlparse(settings.STATIC_URL or "").path
        script = getattr(settings, "FORCE_SCRIPT_NAME", None)
        if script:
            prefix = prefix.removeprefix(script.rstrip("/"))
    prefix = "/" + prefix.strip("/") + "/"
    return prefix if prefix != "//" else None


def _load_sync(handler: BaseHandler, paths: list[str]) -> None:
    """``BaseHandler.load_middleware(is_async=False)`` for these middleware only
    (all sync-capable, so nothing needs adapting)."""
    handler._view_middleware = []
    handler._template_response_middleware = []
    handler._exception_middleware = []
    chain = convert_exception_to_response(handler._get_response)
    for dotted in reversed(paths):
        try:
            instance = import_string(dotted)(chain)
        except MiddlewareNotUsed:
            continue
        if instance is None:
            raise ImproperlyConfigured(f"Middleware factory {dotted} returned None.")
        if hasattr(instance, "process_view"):
            handler._view_middleware.insert(0, instance.process_view)
        if hasattr(instance, "process_template_response"):
            handler._template_response_middleware.append(instance.process_template_response)
        if hasattr(instance, "process_exception"):
            handler._exception_middleware.append(instance.process_exception)
        chain = convert_exception_to_response(instance)
    handler._middleware_chain = chain
