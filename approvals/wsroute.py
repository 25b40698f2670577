"""Where the inbox page's script opens its WebSocket.

``APPROVALS["INBOX_WEBSOCKET_URL"]`` when set; otherwise the route at which the
host's ``ASGI_APPLICATION`` serves :class:`approvals.consumers.ApprovalsConsumer`,
found once by walking its router (``/ws/approvals/`` when it cannot be found).
"""

from __future__ import annotations

from functools import cache
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.urls import get_script_prefix
from django.utils.module_loading import import_string

from ._compat import route_to_consumer
from .conf import setting

DEFAULT_ROUTE = "ws/approvals/"


def inbox_websocket_url() -> str:
    """A path on the page's host (ws:// or wss:// follows the page) or a full ws(s):// URL."""
    configured = setting("INBOX_WEBSOCKET_URL")
    if configured is not None:
        return configured
    route = mounted_route()
    return get_script_prefix() + (route if route is not None else DEFAULT_ROUTE)


@cache
def mounted_route() -> str | None:
    """The route (no leading slash) of the approvals consumer in ``ASGI_APPLICATION``."""
    try:
        application = import_string(settings.ASGI_APPLICATION)
    except Exception:  # unset or not importable here: the caller falls back
        return None
    return route_to_consumer(application, _is_approvals_consumer)


def _is_approvals_consumer(consumer: type) -> bool:
    return any(c.__module__ == "approvals.consumers" for c in consumer.__mro__)


@receiver(setting_changed)
def _reset(*, setting: str, **kwargs: Any) -> None:
    if setting in ("APPROVALS", "ASGI_APPLICATION"):
        mounted_route.cache_clear()
