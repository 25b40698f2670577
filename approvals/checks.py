"""System checks: configurations that work on a laptop and fail in production."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import Error, Tags, Warning, register
from django.core.exceptions import ImproperlyConfigured

from .channellink import is_in_memory
from .conf import get_config, setting

#: The in-memory channel layer with ``DEBUG = False``.
W001 = "approvals.W001"
#: A SQLite database not in WAL mode.
W002 = "approvals.W002"
#: A SQLite database without IMMEDIATE transactions.
W003 = "approvals.W003"
#: No channel layer under ``APPROVALS["CHANNEL_LAYER"]``.
W004 = "approvals.W004"
#: ``APPROVALS`` names a key the app does not know.
E001 = "approvals.E001"
#: A number setting (a timing, a size or a limit) that is not a positive number.
E002 = "approvals.E002"
#: ``LEASE_TIMEOUT`` not more than twice ``HEARTBEAT_INTERVAL``.
E003 = "approvals.E003"


@register(Tags.compatibility)
def check_channel_layer(app_configs: Any = None, **kwargs: Any) -> list:
    try:
        alias = setting("CHANNEL_LAYER")
    except ImproperlyConfigured:
        return []  # check_settings reports the bad APPROVALS as approvals.E001
    layers = getattr(settings, "CHANNEL_LAYERS", None) or {}
    if alias not in layers:
        return [
            Warning(
                f"No channel layer {alias!r} is configured in CHANNEL_LAYERS.",
                hint=(
                    "Without one, decisions and live updates cross processes only through "
                    "the database (SQLite's change counter or PostgreSQL's notifications, "
                    "else the re-check every RECHECK_INTERVAL). Configure "
                    "channels_redis.core.RedisChannelLayer for several server hosts."
                ),
                id=W004,
            )
        ]
    if is_in_memory(alias) and not settings.DEBUG:
        return [
            Warning(
                "The in-memory channel layer is configured with DEBUG = False.",
                hint=(
                    "InMemoryChannelLayer never crosses a process boundary: with several "
                    "server processes, or agents in their own processes, decisions arrive "
                    "only through the database (SQLite's change counter, PostgreSQL's "
                    "notifications, else the re-check). Use channels_redis in production."
                ),
                id=W001,
            )
        ]
    return []


@register(Tags.compatibility)
def check_sqlite(app_configs: Any = None, **kwargs: Any) -> list:
    problems = []
    for alias, db in settings.DATABASES.items():
        if "sqlite3" not in db.get("ENGINE", ""):
            continue
        options = db.get("OPTIONS", {}) or {}
        init = str(options.get("init_command", "")).lower().replace(" ", "")
        if "journal_mode=wal" not in init:
            problems.append(
                Warning(
                    f"SQLite database {alias!r} is not configured for WAL.",
                    hint=(
                        "Agents and the server write concurrently. Add "
                        "'init_command': 'PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;' "
                        "to OPTIONS."
                    ),
                    id=W002,
                )
            )
        if str(options.get("transaction_mode", "")).upper() != "IMMEDIATE":
            problems.append(
                Warning(
                    f"SQLite database {alias!r} does not use IMMEDIATE transactions.",
                    hint=(
                        "Deferred transactions that upgrade to writes fail with 'database is "
                        "locked' under concurrency. Set 'transaction_mode': 'IMMEDIATE' in "
                        "OPTIONS (and a 'timeout' of several seconds)."
                    ),
                    id=W003,
                )
            )
    return problems


@register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list:
    try:
        config = get_config()
    except ImproperlyConfigured as exc:
        return [Error(str(exc), id=E001)]
    errors = []
    for key in (
        "DECISION_TIMEOUT",
        "RECHECK_INTERVAL",
        "HEARTBEAT_INTERVAL",
        "LEASE_TIMEOUT",
        "AGENT_LEASE_TIMEOUT",
        "MAX_ARGUMENTS_BYTES",
        "SNAPSHOT_MAX_BYTES",
        "PREVIEW_BYTES",
        "SOCKET_QUEUE_LIMIT",
        "SOCKET_BACKLOG_BYTES",
        "MAX_SOCKETS_PER_USER",
        "SOCKET_RECHECK_SECONDS",
        "SOCKET_DB_THREADS",
    ):
        value = config[key]
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            errors.append(
                Error(f"APPROVALS[{key!r}] must be a positive number, not {value!r}.", id=E002)
            )
    if config["LEASE_TIMEOUT"] <= config["HEARTBEAT_INTERVAL"] * 2:
        errors.append(
            Error(
                "APPROVALS['LEASE_TIMEOUT'] must be more than twice HEARTBEAT_INTERVAL, or live "
                "waiters would be marked abandoned.",
                id=E003,
            )
        )
    return errors
