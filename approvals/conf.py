"""The app's settings: one ``APPROVALS`` dict, read lazily.

Every key has a default here; a host project sets only what it wants to change.
The merged dict is cached and dropped whenever Django reports that
``APPROVALS`` changed, so ``override_settings(APPROVALS=...)`` just works.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

DEFAULTS: dict[str, Any] = {
    # Seconds a call waits for a person before it is recorded ``expired``.
    "DECISION_TIMEOUT": 3600,
    # Seconds between the per-process database re-checks (the safety net behind
    # the channel layer, and the transport itself without a cross-process layer).
    "RECHECK_INTERVAL": 1.0,
    # Seconds between a waiting process's heartbeats.
    "HEARTBEAT_INTERVAL": 5.0,
    # A waiter whose process has not beaten for this long is dead: its calls are
    # marked ``abandoned`` by the sweep.
    "LEASE_TIMEOUT": 30.0,
    # Seconds between sweeps run inside each process listener; ``None`` leaves
    # the sweep to ``manage.py approvals_sweep`` alone.
    "SWEEP_INTERVAL": 30.0,
    # Largest accepted request body (HTTP) and WebSocket text frame, in bytes.
    "MAX_BODY_BYTES": 16 * 1024,
    # Longest accepted reason and ids.
    "MAX_REASON_LENGTH": 2000,
    # Channel-layer group every process listener joins (must match [a-zA-Z0-9._-]).
    "GROUP_PREFIX": "approvals",
    # Largest number of pending calls sent in a snapshot or the pending list.
    "PENDING_LIMIT": 500,
    # Name of the channel layer (in CHANNEL_LAYERS) the app uses.
    "CHANNEL_LAYER": "default",
    # Seconds a process trusts its cached rules before asking the database
    # whether they changed (changes in this process apply at once).
    "RULES_CACHE_SECONDS": 1.0,
    # Where the inbox page's script opens its WebSocket: a path on the page's host
    # (ws:// or wss:// follows the page) or a full ws(s):// URL. ``None``: found in
    # the router of ``settings.ASGI_APPLICATION``, wherever the host mounted
    # ``approvals.routing.websocket_urlpatterns`` (``/ws/approvals/`` if not found).
    "INBOX_WEBSOCKET_URL": None,
}


@cache
def get_config() -> dict[str, Any]:
    """Return the merged settings: ``DEFAULTS`` overlaid with ``settings.APPROVALS``."""
    user = getattr(settings, "APPROVALS", None) or {}
    unknown = set(user) - set(DEFAULTS)
    if unknown:
        from django.core.exceptions import ImproperlyConfigured

        raise ImproperlyConfigured(
            f"Unknown APPROVALS setting(s): {', '.join(sorted(unknown))}. "
            f"Known: {', '.join(sorted(DEFAULTS))}."
        )
    return {**DEFAULTS, **user}


def setting(name: str) -> Any:
    """Return one setting by name (a ``None`` that has a derived value is resolved)."""
    value = get_config()[name]
    if value is None and name == "INBOX_WEBSOCKET_URL":
        from django.urls import get_script_prefix

        route = _mounted_websocket_route()
        return get_script_prefix() + (route if route is not None else "ws/approvals/")
    return value


@cache
def _mounted_websocket_route() -> str | None:
    """The route (no leading slash) of the approvals consumer in ``ASGI_APPLICATION``."""
    from django.utils.module_loading import import_string

    try:
        application = import_string(settings.ASGI_APPLICATION)
    except Exception:  # unset or not importable here: the caller falls back
        return None
    return _route_to_consumer(application, "", 0)


def _route_to_consumer(node: Any, prefix: str, depth: int) -> str | None:
    # Walks ProtocolTypeRouter -> middleware (.application/.inner) -> URLRouter.routes.
    from django.urls.resolvers import RoutePattern

    if node is None or depth > 40:
        return None
    consumer = getattr(node, "consumer_class", None)
    if isinstance(consumer, type) and any(
        c.__module__ == "approvals.consumers" for c in consumer.__mro__
    ):
        return prefix
    mapping = getattr(node, "application_mapping", None)
    if isinstance(mapping, dict):
        return _route_to_consumer(mapping.get("websocket"), prefix, depth + 1)
    routes = getattr(node, "routes", None)
    if isinstance(routes, list | tuple):
        for route in routes:
            pattern = getattr(route, "pattern", None)
            literal = str(pattern)
            if not isinstance(pattern, RoutePattern) or "<" in literal:
                continue  # a regex or a converter: no single path to give the page
            found = _route_to_consumer(
                getattr(route, "callback", None), prefix + literal, depth + 1
            )
            if found is not None:
                return found
        return None
    for attribute in ("application", "inner", "app"):
        inner = getattr(node, attribute, None)
        if inner is not None and inner is not node:
            return _route_to_consumer(inner, prefix, depth + 1)
    return None


@receiver(setting_changed)
def _reset(*, setting: str, **kwargs: Any) -> None:
    if setting == "APPROVALS":
        get_config.cache_clear()
    if setting in ("APPROVALS", "ASGI_APPLICATION"):
        _mounted_websocket_route.cache_clear()
