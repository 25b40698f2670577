"""A session and its user read in one statement, for every signed-in request.

A signed-in request reads its session row, decodes it, then reads the user row
the session names: two statements one after the other, two round trips to a
database server. The user a session names stays the same while its key does
(Django gives a new key at sign-in and at sign-out), so this process keeps, for
the sessions it read recently, which user each one named. The next read of
such a session reads that user's row in the same statement
(:func:`approvals.keyread.get_joined`), and ``approvals.backends.ModelBackend``
takes that row instead of reading it again.

Nothing is trusted from memory; memory only says which row to read along:

* the user row is read fresh, in the same statement as the session row;
* ``get_user(user_id)`` takes it only if it is that very user (the id the
  decoded session names), else it reads the user as before;
* only within the same request: the row waits in a context variable that
  each session read sets, that taking it clears, and that the end of every
  request clears, and it is not taken after ``FRESH`` seconds;
* no session key is kept, only its hash, in a map of at most ``MAX_SESSIONS``
  entries (a collision costs a normal read, nothing else).

Used only when the session's backend takes the row (it has a true
``takes_session_user``: ``approvals.backends.ModelBackend`` and its
subclasses), the user model is read whole by its manager
(:func:`approvals.keyread.plain`), and it lives on the sessions' database.
"""

from __future__ import annotations

import threading
import time
from contextvars import ContextVar
from dataclasses import dataclass
from functools import cache
from typing import Any

from django.contrib.auth import BACKEND_SESSION_KEY, SESSION_KEY, get_user_model
from django.core.exceptions import ValidationError
from django.core.signals import request_finished
from django.db import router
from django.utils.module_loading import import_string

from . import keyread

#: Seconds a user row read with its session may wait to be taken.
FRESH = 1.0
#: Sessions whose user this process keeps (the oldest goes first).
MAX_SESSIONS = 10_000


@dataclass(frozen=True)
class _Offer:
    model: type
    using: str
    pk: Any
    row: Any  # the user, or None when no such user exists
    at: float


_offered: ContextVar[_Offer | None] = ContextVar("approvals_session_user", default=None)
_owners: dict[int, Any] = {}
_lock = threading.Lock()


def read(model: type, using: str, key: str, later: tuple[str, Any]):
    """The session row (as :func:`approvals.keyread.get`), with its user's row
    alongside when this process knows which user the session names."""
    _offered.set(None)
    owner = _owners.get(hash(key))
    user_model = get_user_model()
    if owner is None or not _joinable(user_model, using):
        return keyread.get(model, using, "session_key", key, later)
    found, user = keyread.get_joined(model, using, "session_key", key, later, user_model, owner)
    if found is not None:
        _offered.set(_Offer(user_model, using, owner, user, time.monotonic()))
    return found


def remember(key: str | None, data: dict) -> None:
    """After a session is decoded: which user it names, when its backend takes rows."""
    if key is None:
        return
    backend = data.get(BACKEND_SESSION_KEY)
    user_id = data.get(SESSION_KEY)
    if not isinstance(backend, str) or user_id is None or not _takes(backend):
        return
    try:
        pk = get_user_model()._meta.pk.to_python(user_id)
    except ValidationError:
        return
    digest = hash(key)
    if _owners.get(digest) == pk:
        return
    with _lock:
        while len(_owners) >= MAX_SESSIONS:
            del _owners[next(iter(_owners))]
        _owners[digest] = pk


def take(model: type, using: str, pk: Any) -> tuple[bool, Any]:
    """``(True, user or None)`` when this request's session read fetched user ``pk``
    of ``model`` on ``using`` less than ``FRESH`` seconds ago; else ``(False, None)``.
    Either way the row is gone afterwards."""
    offer = _offered.get()
    if offer is None:
        return False, None
    _offered.set(None)
    if (
        offer.model is model
        and offer.using == using
        and offer.pk == pk
        and time.monotonic() - offer.at < FRESH
    ):
        return True, offer.row
    return False, None


def forget(**kwargs: Any) -> None:
    """Drop a row not taken (connected to ``request_finished``)."""
    if _offered.get() is not None:
        _offered.set(None)


request_finished.connect(forget, dispatch_uid="approvals.sessionuser.forget")


def _joinable(user_model: type, using: str) -> bool:
    return router.db_for_read(user_model) == using and keyread.plain(user_model)


@cache
def _takes(backend_path: str) -> bool:
    """Whether the backend at ``backend_path`` takes the rows read here (it says
    so with a true ``takes_session_user``, as ``approvals.backends.ModelBackend``)."""
    try:
        backend = import_string(backend_path)
    except ImportError:
        return False
    return getattr(backend, "takes_session_user", False) is True
