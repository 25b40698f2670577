"""Agent keys: what an agent outside Django presents (``Authorization: Bearer``).

A key reads ``tg_<prefix>_<secret>``: ``prefix`` (8 hex characters, stored and
shown, not secret) finds the row with one indexed look-up; ``secret`` (256
random bits, URL-safe) is never stored, only its hash.

Why SHA-256 and not a password hash: a slow hash (PBKDF2, Argon2) protects
*low-entropy* secrets that a person chose, by making each guess expensive.
These secrets are 256 random bits: no dictionary holds them and no amount of
hashing speed makes brute force feasible, so a leaked hash is as good as
useless either way, while a slow hash would cost milliseconds of CPU on every
agent request (every long-poll). This is the choice of GitHub's prefixed
tokens and django-rest-knox (a SHA-512 digest of a random token). The digest
is domain-separated (keyed with a fixed label) and compared with
:func:`hmac.compare_digest`, so the comparison leaks no timing about the stored
hash. ``last_used_at`` is written at most once a minute per key, so a busy
agent costs no write per request.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import string
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from .models import AgentKey

__all__ = ["create_key", "hash_secret", "list_keys", "revoke_key", "verify"]

KEY_PREFIX = "tg"
_PREFIX_HEX = 8
_LABEL = b"toolgate-agent-key-v1"
_SCHEME = "sha256"
#: ``last_used_at`` is written at most this often (seconds) per key.
TOUCH_EVERY = 60.0
#: A fixed hash compared against when no key has the prefix, so an unknown
#: prefix costs the same work as a wrong secret.
_DUMMY = f"{_SCHEME}${'0' * 64}"


def hash_secret(secret: str) -> str:
    """The stored form of a key's secret part: ``sha256$<hex>``."""
    digest = hmac.new(_LABEL, secret.encode("utf-8", "surrogatepass"), hashlib.sha256)
    return f"{_SCHEME}${digest.hexdigest()}"


def _split(raw: str) -> tuple[str, str] | None:
    parts = raw.split("_", 2)
    if len(parts) != 3 or parts[0] != KEY_PREFIX:
        return None
    prefix, secret = parts[1], parts[2]
    if len(prefix) != _PREFIX_HEX or not secret or len(secret) > 200:
        return None
    if prefix.strip(string.hexdigits):  # not hex (a NUL, say): no key has it
        return None
    return prefix, secret


def create_key(user: Any, name: str) -> tuple[AgentKey, str]:
    """Create a key named ``name`` for ``user``; return the row and the key itself.

    The key is shown to its owner once: only its hash is stored. Raises
    ``ValueError`` when the name is empty or taken.
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError("an agent key needs a name")
    if AgentKey.objects.filter(name=name).exists():
        raise ValueError(f"an agent key named {name!r} exists already")
    for _ in range(5):  # a prefix clash is a 1-in-4-billion event; retry it anyway
        prefix = secrets.token_hex(_PREFIX_HEX // 2)
        secret = secrets.token_urlsafe(32)
        try:
            with transaction.atomic():
                key = AgentKey.objects.create(
                    name=name, user=user, prefix=prefix, key_hash=hash_secret(secret)
                )
        except IntegrityError:
            if AgentKey.objects.filter(name=name).exists():
                raise ValueError(f"an agent key named {name!r} exists already") from None
            continue
        return key, f"{KEY_PREFIX}_{prefix}_{secret}"
    raise RuntimeError("could not find a free agent key prefix")


def verify(raw: str) -> AgentKey | None:
    """The live (not revoked) key ``raw`` is, with its user loaded; ``None`` otherwise.

    Marks the key used (at most once a minute).
    """
    parts = _split(raw) if isinstance(raw, str) else None
    key = None
    if parts is not None:
        key = (
            AgentKey.objects.select_related("user")
            .filter(prefix=parts[0], revoked_at__isnull=True)
            .first()
        )
    stored = key.key_hash if key is not None else _DUMMY
    offered = hash_secret(parts[1] if parts else "")
    if not hmac.compare_digest(stored.encode(), offered.encode()) or key is None:
        return None
    if not key.user.is_active:
        return None
    _touch(key)
    return key


def _touch(key: AgentKey) -> None:
    now = timezone.now()
    last = key.last_used_at
    if last is not None and (now - last).total_seconds() < TOUCH_EVERY:
        return
    AgentKey.objects.filter(pk=key.pk).update(last_used_at=now)
    key.last_used_at = now


def revoke_key(name: str) -> bool:
    """Revoke the key named ``name``; ``False`` when there is none or it was revoked."""
    changed = AgentKey.objects.filter(name=name, revoked_at__isnull=True).update(
        revoked_at=timezone.now()
    )
    return bool(changed)


def list_keys() -> list[AgentKey]:
    """Every key, newest first, with its user."""
    return list(AgentKey.objects.select_related("user").order_by("-created_at", "-pk"))
