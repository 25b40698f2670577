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
    # An agent that gated a call over HTTP and then neither asks about it nor holds
    # a wait open for this long has the call marked ``abandoned`` by the sweep.
    "AGENT_LEASE_TIMEOUT": 120.0,
    # Seconds between sweeps run inside each process listener; ``None`` leaves
    # the sweep to ``manage.py approvals_sweep`` alone.
    "SWEEP_INTERVAL": 30.0,
    # Largest accepted request body (HTTP) and WebSocket text frame, in bytes.
    "MAX_BODY_BYTES": 16 * 1024,
    # Longest accepted reason and ids.
    "MAX_REASON_LENGTH": 2000,
    # Channel-layer group every process listener joins (must match [a-zA-Z0-9._-]).
    "GROUP_PREFIX": "approvals",
    # Largest ``arguments`` of a gated call, in bytes of compact JSON (the gate
    # raises ValueError above it), so every event fits a WebSocket frame.
    "MAX_ARGUMENTS_BYTES": 64 * 1024,
    # Largest ``arguments`` a socket event or snapshot item carries, in bytes of compact
    # JSON; larger ones are sent as the start of that text with
    # ``"arguments_truncated": true`` (the page loads the rest from
    # ``tool-approvals/<approval_id>``). At most 192 KiB is used.
    "PREVIEW_BYTES": 64 * 1024,
    # Largest snapshot frame, in bytes (at most 768 KiB is used): the oldest calls
    # that fit are sent, with ``"more"`` saying how many were left out.
    "SNAPSHOT_MAX_BYTES": 512 * 1024,
    # Events queued for one socket before it counts as too slow and is closed
    # (code 4408; the page reconnects and gets a fresh snapshot).
    "SOCKET_QUEUE_LIMIT": 1000,
    # Bytes the server may hold unsent for one socket (a client that stops
    # reading) before the socket is closed with code 4408.
    "SOCKET_BACKLOG_BYTES": 4 * 1024 * 1024,
    # Open sockets per user in one process; one more is refused with code 4429.
    "MAX_SOCKETS_PER_USER": 20,
    # Seconds between checks that each open socket's user is still active,
    # signed in and (for sockets that see everyone's calls) still a decider.
    "SOCKET_RECHECK_SECONDS": 3.0,
    # SQLite in WAL mode: copy the WAL back into the database from a thread beside
    # each process listener (passive checkpoints), not in the commit that fills it.
    "SQLITE_CHECKPOINTS": True,
    # Threads per process for the sockets' database work (snapshot, tool_confirm).
    "SOCKET_DB_THREADS": 8,
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
    # Where the site is served (e.g. "https://toolgate.example.com"): makes the links
    # in webhooks and emails absolute. ``None``: links are paths only.
    "SITE_URL": None,
    # Seconds a webhook delivery (or email) is retried before it is given up.
    "WEBHOOK_RETRY_FOR": 86400,
    # Seconds one webhook POST may take before it counts as failed.
    "WEBHOOK_TIMEOUT": 10.0,
    # Webhook POSTs and emails one process sends at once.
    "WEBHOOK_CONCURRENCY": 8,
    # Fraction of a call's time after which ``approval.expiring`` fires (once).
    "EXPIRING_AFTER": 0.8,
    # Email the call's user (Django's mail) when a call is gated and when it expires soon.
    "EMAIL_NOTIFICATIONS": False,
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
    """Return one setting by name."""
    return get_config()[name]


@receiver(setting_changed)
def _reset(*, setting: str, **kwargs: Any) -> None:
    if setting == "APPROVALS":
        get_config.cache_clear()
