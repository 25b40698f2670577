"""Django's ASGI handler, serving a synchronous view's whole request in one thread hop.

Under ASGI, Django builds its middleware chain in async mode. Middleware
written the classic way (``MiddlewareMixin``: all of Django's own) then runs
each ``process_request``, ``process_view`` and ``process_response`` through a
``sync_to_async`` of its own: with this site's middleware and a synchronous
view, 16 or 17 hand-offs between the event loop and a request thread per
request (3 here, with the ``request_started`` and ``request_finished``
receivers), each a future, a queue, a wake-up and the interpreter lock
changing hands. On one daphne process those hand-offs cost more than
everything else a trivial request does (bench/request_parts.py).

:class:`OneHopASGIHandler` keeps a second chain of the same middleware, built
in sync mode as Django builds it under WSGI, and runs it with the view in one
``sync_to_async`` call when the path resolves to a synchronous view. Django's
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
from django.core.exceptions import ImproperlyConfigured, MiddlewareNotUsed
from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.base import BaseHandler
from django.core.handlers.exception import convert_exception_to_response
from django.urls import Resolver404, get_resolver
from django.utils.module_loading import import_string

SERVESTATIC = "servestatic.middleware.ServeStaticMiddleware"


class OneHopASGIHandler(ASGIHandler):
    """``ASGIHandler`` that serves synchronous views with one thread hop."""

    def __init__(self) -> None:
        super().__init__()
        paths, self.async_prefixes = _sync_middleware(list(settings.MIDDLEWARE))
        self.sync_handler: BaseHandler | None = None
        if paths is not None:
            self.sync_handler = BaseHandler()
            _load_sync(self.sync_handler, paths)

    def one_hop(self, path: str) -> bool:
        """Whether ``path`` is served by the sync chain (a synchronous view)."""
        if self.sync_handler is None or path.startswith(self.async_prefixes):
            return False
        try:
            match = get_resolver().resolve(path)
        except Resolver404:
            return False
        return not iscoroutinefunction(match.func)

    async def get_response_async(self, request):
        if not self.one_hop(request.path_info):
            return await super().get_response_async(request)
        get_response = self.sync_handler.get_response
        return await sync_to_async(get_response, thread_sensitive=True)(request)


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
