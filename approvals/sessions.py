"""A session engine: Django's database sessions, each read in one composed statement.

``SESSION_ENGINE = "approvals.sessions"`` behaves as
``django.contrib.sessions.backends.db`` in every way (same table, same model,
same expiry, same writes; a session made by either engine is read by the
other) except how a session is read: by :mod:`approvals.keyread` instead of a
queryset, about 0.3 ms less for every signed-in request, and, once this
process has seen the session, together with its user's row in the same
statement (:mod:`approvals.sessionuser`; ``approvals.backends.ModelBackend``
takes it, one round trip fewer). A subclass that returns another model from
``get_model_class`` keeps working; a model spread over several tables is read
through the ORM as before.

Decoding checks the session data's signature (two SHA-256 hashes and an HMAC)
before it parses the JSON. The same signed string under the same secret keys
always decodes to the same data, so a process keeps the last ``MAX_DECODED``
results of small sessions whose values are all plain (strings, numbers,
booleans, ``None``: a signed-in session is), keyed by the store's class, the
secret keys and the whole signed string; each load gets a copy of its own.
A string that fails its check is never kept, and changing ``SECRET_KEY`` or
``SECRET_KEY_FALLBACKS`` changes the key.
"""

from __future__ import annotations

import logging
import threading

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.sessions.backends import db
from django.core.exceptions import SuspiciousOperation
from django.db import router
from django.utils import timezone

from . import keyread, sessionuser

#: Decoded sessions kept by this process (the oldest goes first).
MAX_DECODED = 4096
#: Longer signed strings are decoded every time.
MAX_KEPT_LENGTH = 2048
_PLAIN = (str, int, float, bool, type(None))
_decoded: dict[tuple, dict] = {}
_lock = threading.Lock()


class SessionStore(db.SessionStore):
    """Django's database session store, reading its row with a composed statement."""

    def load(self):
        data = super().load()
        sessionuser.remember(self.session_key, data)
        return data

    async def aload(self):
        data = await super().aload()
        sessionuser.remember(self.session_key, data)
        return data

    def decode(self, session_data):
        if not isinstance(session_data, str) or len(session_data) > MAX_KEPT_LENGTH:
            return super().decode(session_data)
        key = (type(self), settings.SECRET_KEY, tuple(settings.SECRET_KEY_FALLBACKS), session_data)
        kept = _decoded.get(key)
        if kept is not None:
            return dict(kept)
        data = super().decode(session_data)
        if data and isinstance(data, dict) and all(type(v) in _PLAIN for v in data.values()):
            with _lock:
                while len(_decoded) >= MAX_DECODED:
                    del _decoded[next(iter(_decoded))]
                _decoded[key] = dict(data)
        return data

    def _get_session_from_db(self):
        model = self.model
        if not keyread.composable(model):
            return super()._get_session_from_db()
        key = self.session_key
        found = None
        try:
            if key is not None:
                later = ("expire_date", timezone.now())
                found = sessionuser.read(model, router.db_for_read(model), key, later)
        except SuspiciousOperation as e:  # as the ORM's read logs it
            logging.getLogger(f"django.security.{e.__class__.__name__}").warning(str(e))
        if found is None:
            self._session_key = None
        return found

    async def _aget_session_from_db(self):
        return await sync_to_async(self._get_session_from_db)()
