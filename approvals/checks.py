"""System checks: configurations that work on a laptop and fail in production."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import Error, Tags, Warning, register

W001 = "approvals.W001"
W002 = "approvals.W002"
W003 = "approvals.W003"
W004 = "approvals.W004"
E001 = "approvals.E001"


@register(Tags.compatibility)
def check_channel_layer(app_configs: Any = None, **kwargs: Any) -> list:
    from django.core.exceptions import ImproperlyConfigured

    from .conf import setting

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
                    "the database re-check (about RECHECK_INTERVAL late). Configure "
                    "channels_redis.core.RedisChannelLayer for more than one process."
                ),
                id=W004,
            )
        ]
    backend = str(layers[alias].get("BACKEND", ""))
    if backend.endswith("InMemoryChannelLayer") and not settings.DEBUG:
        return [
            Warning(
                "The in-memory channel layer is configured with DEBUG = False.",
                hint=(
                    "InMemoryChannelLayer never crosses a process boundary: with several "
                    "server processes, or agents in their own processes, decisions arrive "
                    "only through the database re-check. Use channels_redis in production."
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
    from django.core.exceptions import ImproperlyConfigured

    from .conf import get_config

    try:
        config = get_config()
    except ImproperlyConfigured as exc:
        return [Error(str(exc), id=E001)]
    errors = []
    for key in ("DECISION_TIMEOUT", "RECHECK_INTERVAL", "HEARTBEAT_INTERVAL", "LEASE_TIMEOUT"):
        value = config[key]
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            errors.append(
                Error(f"APPROVALS[{key!r}] must be a positive number, not {value!r}.", id=E001)
            )
    if config["LEASE_TIMEOUT"] <= config["HEARTBEAT_INTERVAL"] * 2:
        errors.append(
            Error(
                "APPROVALS['LEASE_TIMEOUT'] must be more than twice HEARTBEAT_INTERVAL, or live "
                "waiters would be marked abandoned.",
                id=E001,
            )
        )
    return errors
