"""Every reliance on another library's private names, fenced in one place.

Each function here leans on something Python, Django or Channels does not
promise. ``tests/test_compat.py`` checks each one against the installed
versions, so an upgrade that changes them fails loudly there instead of
silently elsewhere. Nothing else in the app touches a private name.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

# -- Python: threading.Event ------------------------------------------------


class _HookedCondition:
    """A stand-in for an Event's condition that runs hooks on ``notify_all``."""

    def __init__(self, inner: threading.Condition) -> None:
        self._inner = inner
        self.hooks: list[Callable[[], None]] = []

    def __enter__(self) -> Any:
        return self._inner.__enter__()

    def __exit__(self, *exc: Any) -> Any:
        return self._inner.__exit__(*exc)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def notify_all(self) -> None:
        self._inner.notify_all()
        for hook in list(self.hooks):
            hook()


def hook_event_set(event: threading.Event, callback: Callable[[], None]) -> Callable[[], None]:
    """Call ``callback`` from the setting thread whenever ``event.set()`` runs.

    ``threading.Event`` has no public hook, but every ``set()`` notifies through
    its private condition ``_cond``; wrapping it reaches even a bound ``set``
    taken earlier (``Timer(1, ev.set)``). Returns a function removing the hook.
    """
    cond = event._cond
    if not isinstance(cond, _HookedCondition):
        cond = _HookedCondition(cond)
        event._cond = cond
    cond.hooks.append(callback)

    def remove() -> None:
        try:
            cond.hooks.remove(callback)
        except ValueError:
            pass

    return remove


# -- Django: test case transactions ----------------------------------------


def only_testcase_transactions(connection: Any) -> bool:
    """True when every open atomic block on ``connection`` is a test case's wrapper.

    Such blocks never commit, so ``on_commit`` callbacks would never run; the
    app then runs them when its own block ends, so waiters in a host project's
    ``TestCase`` wake as they would in production. Django marks those blocks
    with the private ``_from_testcase`` flag on ``connection.atomic_blocks``.
    """
    return connection.in_atomic_block and all(
        getattr(block, "_from_testcase", False) for block in connection.atomic_blocks
    )


# -- Channels: the router tree ---------------------------------------------


def route_to_consumer(node: Any, is_target: Callable[[type], bool]) -> str | None:
    """The route (no leading slash) at which ``node``'s tree serves a consumer class
    for which ``is_target`` is true, or ``None``.

    Channels has no public way to list routes: this walks the attributes its
    routers and middleware keep (``application_mapping``, ``routes`` with
    ``pattern``/``callback``, ``consumer_class``, ``inner``/``application``).
    A route with a regex or a converter is skipped: it names no single path.
    """
    return _walk(node, "", 0, is_target)


def _walk(node: Any, prefix: str, depth: int, is_target: Callable[[type], bool]) -> str | None:
    from django.urls.resolvers import RoutePattern

    if node is None or depth > 40:
        return None
    consumer = getattr(node, "consumer_class", None)
    if isinstance(consumer, type) and is_target(consumer):
        return prefix
    mapping = getattr(node, "application_mapping", None)
    if isinstance(mapping, dict):
        return _walk(mapping.get("websocket"), prefix, depth + 1, is_target)
    routes = getattr(node, "routes", None)
    if isinstance(routes, list | tuple):
        for route in routes:
            pattern = getattr(route, "pattern", None)
            literal = str(pattern)
            if not isinstance(pattern, RoutePattern) or "<" in literal:
                continue
            found = _walk(getattr(route, "callback", None), prefix + literal, depth + 1, is_target)
            if found is not None:
                return found
        return None
    for attribute in ("application", "inner", "app"):
        inner = getattr(node, attribute, None)
        if inner is not None and inner is not node:
            return _walk(inner, prefix, depth + 1, is_target)
    return None


# -- daphne / Twisted: bytes a socket has not yet taken --------------------------


def unsent_bytes_probe(send: Any) -> Callable[[], int] | None:
    """A function returning the bytes queued in the server for this connection, or ``None``.

    ASGI has no backpressure for WebSocket sends: daphne hands every frame to
    Twisted, which buffers without limit for a client that stops reading. Under
    daphne, the consumer's ``send`` is ``partial(server.handle_reply, protocol)``
    and the protocol's Twisted transport keeps its unsent bytes in
    ``dataBuffer``/``offset`` and ``_tempDataLen``. Channels' session middleware
    hands the consumer its own ``send`` and keeps daphne's as ``real_send``: that
    wrapping is looked through. Any other server: ``None``.
    """
    for _ in range(8):  # middleware that wrap send the way Channels' sessions do
        inner = getattr(getattr(send, "__self__", None), "real_send", None)
        if inner is None:
            break
        send = inner
    protocol = send.args[0] if getattr(send, "args", None) else None
    transport = getattr(protocol, "transport", None)
    if transport is None or not hasattr(transport, "_tempDataLen"):
        return None

    def unsent() -> int:
        buffered = len(getattr(transport, "dataBuffer", b"")) - getattr(transport, "offset", 0)
        return buffered + getattr(transport, "_tempDataLen", 0)

    return unsent
