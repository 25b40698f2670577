"""The WebSocket Origin check: the page's own scheme, host and port, or a trusted origin.

Channels' ``AllowedHostsOriginValidator`` compares the Origin's host with
``ALLOWED_HOSTS`` and ignores its scheme and port, so a page served from
another port of the same host (another app, a dev server) could open a socket
with the user's cookies. :class:`OriginValidator` accepts an Origin only when
it equals the request's own ``scheme://host:port`` (the scheme from the ASGI
scope, the host and port from the ``Host`` header, which must be in
``ALLOWED_HOSTS``) or is listed in ``CSRF_TRUSTED_ORIGINS`` (the list Django's
CSRF check already trusts, ``https://*.example.com`` wildcards included).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.http.request import split_domain_port, validate_host

_DEFAULT_PORTS = {"http": 80, "https": 443}
#: What a refused handshake is closed with (the code a browser sees is 1006).
CLOSE_FORBIDDEN_ORIGIN = 4403


def _origin_tuple(text: str) -> tuple[str, str, int] | None:
    """``(scheme, host, port)``, the port defaulted by scheme; ``None`` when malformed."""
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parts.hostname or parts.path not in ("", "/"):
        return None
    return scheme, parts.hostname.lower(), port or _DEFAULT_PORTS[scheme]


def _own_origin(scope: dict, host: str) -> tuple[str, str, int] | None:
    scheme = "https" if scope.get("scheme") in ("wss", "https") else "http"
    domain, port = split_domain_port(host)
    if not domain or not validate_host(domain, settings.ALLOWED_HOSTS):
        return None
    return _origin_tuple(f"{scheme}://{domain}:{port}" if port else f"{scheme}://{domain}")


def _trusted(origin: tuple[str, str, int]) -> bool:
    scheme, host, port = origin
    for entry in getattr(settings, "CSRF_TRUSTED_ORIGINS", ()):
        wildcard = "://*." in entry
        trusted = _origin_tuple(entry.replace("://*.", "://", 1))
        if trusted is None or trusted[0] != scheme or trusted[2] != port:
            continue
        if host == trusted[1] or (wildcard and host.endswith("." + trusted[1])):
            return True
    return False


def origin_allowed(scope: dict) -> bool:
    """True when the handshake's Origin is the request's own origin or a trusted one.

    A handshake without an Origin is refused (browsers always send one). A
    handshake without a ``Host`` header (no browser omits it; test
    communicators do) falls back to Channels' rule: the Origin's host must be
    in ``ALLOWED_HOSTS``.
    """
    headers = dict(scope.get("headers") or ())
    raw_origin = headers.get(b"origin")
    if not raw_origin:
        return False
    origin = _origin_tuple(raw_origin.decode("latin-1"))
    if origin is None:
        return False
    if _trusted(origin):
        return True
    raw_host = headers.get(b"host")
    if raw_host is None:
        return validate_host(origin[1], settings.ALLOWED_HOSTS)
    return origin == _own_origin(scope, raw_host.decode("latin-1"))


class OriginValidator:
    """ASGI middleware for the WebSocket side: refuse a handshake from any other origin.

    Use it where Channels' ``AllowedHostsOriginValidator`` would go::

        "websocket": OriginValidator(AuthMiddlewareStack(URLRouter(...)))

    Settings are read per handshake, so ``override_settings`` works.
    """

    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope: dict, receive: Any, send: Any) -> Any:
        if scope.get("type") == "websocket" and not origin_allowed(scope):
            # Refuse the handshake before anything else reads the request.
            message = await receive()
            if message.get("type") == "websocket.connect":
                await send({"type": "websocket.close", "code": CLOSE_FORBIDDEN_ORIGIN})
            return None
        return await self.application(scope, receive, send)
