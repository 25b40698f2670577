"""A session and its user in one statement (``approvals.sessionuser``): one read fewer
once a session has been seen, the same user and the same answers as before, and
nothing taken from another request, another user or an old read."""

from __future__ import annotations

import pytest
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
from django.contrib.sessions.models import Session
from django.core.signals import request_finished
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from approvals import keyread, sessionuser
from approvals.backends import ModelBackend
from approvals.sessions import SessionStore

pytestmark = pytest.mark.django_db(transaction=True)
OURS = "approvals.backends.ModelBackend"


@pytest.fixture(autouse=True)
def _fresh_memory():
    sessionuser._owners.clear()
    sessionuser.forget()
    yield
    sessionuser._owners.clear()
    sessionuser.forget()


def _session(user, backend: str = OURS) -> str:
    store = SessionStore()
    store[SESSION_KEY] = str(user.pk)
    store[BACKEND_SESSION_KEY] = backend
    store[HASH_SESSION_KEY] = user.get_session_auth_hash()
    store.create()
    return store.session_key


def _fields(obj) -> dict:
    return {f.attname: getattr(obj, f.attname) for f in type(obj)._meta.concrete_fields}


def _load_and_get_user(key: str):
    """What a signed-in request does: load the session, then the backend's get_user;
    the user and the statements run."""
    with CaptureQueriesContext(connection) as queries:
        data = SessionStore(key).load()
        user = ModelBackend().get_user(int(data[SESSION_KEY])) if data else None
    return user, [q["sql"] for q in queries]


def test_a_seen_session_reads_its_user_in_the_same_statement(django_user_model):
    alice = django_user_model.objects.create_user("alice", "a@example.com", "pw")
    key = _session(alice)
    first, sql = _load_and_get_user(key)
    assert len(sql) == 2 and "JOIN" not in sql[0]
    second, sql = _load_and_get_user(key)
    assert len(sql) == 1 and "LEFT JOIN" in sql[0] and "django_session" in sql[0]
    assert _fields(second) == _fields(first) == _fields(django_user_model.objects.get(pk=alice.pk))
    assert second._state.db == "default" and not second._state.adding
    assert second.check_password("pw")


def test_the_user_row_is_read_fresh_with_the_session(django_user_model):
    """Deactivated, changed or deleted since the last request: seen at once."""
    alice = django_user_model.objects.create_user("alice")
    key = _session(alice)
    _load_and_get_user(key)
    django_user_model.objects.filter(pk=alice.pk).update(first_name="Alice")
    user, sql = _load_and_get_user(key)
    assert len(sql) == 1 and user.first_name == "Alice"
    django_user_model.objects.filter(pk=alice.pk).update(is_active=False)
    user, sql = _load_and_get_user(key)
    assert len(sql) == 1 and user is None
    django_user_model.objects.filter(pk=alice.pk).delete()
    user, sql = _load_and_get_user(key)
    assert len(sql) == 1 and user is None


def test_a_session_now_naming_another_user_reads_that_user(django_user_model):
    """Memory only says which row to read along; the decoded session decides."""
    alice = django_user_model.objects.create_user("alice")
    bob = django_user_model.objects.create_user("bob")
    key = _session(alice)
    _load_and_get_user(key)
    store = SessionStore(key)
    store[SESSION_KEY] = str(bob.pk)
    store.save()
    user, sql = _load_and_get_user(key)
    assert user.username == "bob"
    assert len(sql) == 2 and "LEFT JOIN" in sql[0]  # alice read along, not taken
    user, sql = _load_and_get_user(key)
    assert user.username == "bob" and len(sql) == 1  # bob is remembered now


def test_an_expired_or_unknown_session_offers_nothing(django_user_model):
    alice = django_user_model.objects.create_user("alice")
    key = _session(alice)
    _load_and_get_user(key)
    Session.objects.filter(session_key=key).update(expire_date=timezone.now())
    assert SessionStore(key).load() == {}
    assert sessionuser.take(django_user_model, "default", alice.pk) == (False, None)


def test_a_row_is_taken_once_and_only_in_its_request(django_user_model):
    alice = django_user_model.objects.create_user("alice")
    key = _session(alice)
    _load_and_get_user(key)
    SessionStore(key).load()
    taken, user = sessionuser.take(django_user_model, "default", alice.pk)
    assert taken and user.pk == alice.pk
    assert sessionuser.take(django_user_model, "default", alice.pk) == (False, None)
    SessionStore(key).load()
    request_finished.send(sender=None)  # the request ended without its user
    assert sessionuser.take(django_user_model, "default", alice.pk) == (False, None)
    SessionStore(key).load()
    assert sessionuser.take(django_user_model, "default", alice.pk + 1) == (False, None)
    assert sessionuser.take(django_user_model, "default", alice.pk) == (False, None)


def test_an_old_row_is_not_taken(django_user_model, monkeypatch):
    alice = django_user_model.objects.create_user("alice")
    key = _session(alice)
    _load_and_get_user(key)
    SessionStore(key).load()
    clock = sessionuser.time.monotonic() + sessionuser.FRESH + 0.1
    monkeypatch.setattr(sessionuser.time, "monotonic", lambda: clock)
    with CaptureQueriesContext(connection) as queries:
        user = ModelBackend().get_user(alice.pk)
    assert user.pk == alice.pk and len(queries) == 1  # read again


def test_other_backends_get_no_row_read_along(django_user_model):
    alice = django_user_model.objects.create_user("alice")
    key = _session(alice, backend="django.contrib.auth.backends.ModelBackend")
    SessionStore(key).load()
    with CaptureQueriesContext(connection) as queries:
        SessionStore(key).load()
    assert len(queries) == 1 and "JOIN" not in queries[0]["sql"]
    assert not sessionuser._owners


def test_a_narrowing_user_manager_gets_no_row_read_along(django_user_model, monkeypatch):
    alice = django_user_model.objects.create_user("alice")
    key = _session(alice)
    _load_and_get_user(key)
    manager = django_user_model._default_manager
    plain = type(manager).get_queryset
    monkeypatch.setattr(
        type(manager), "get_queryset", lambda self: plain(self).filter(username="carol")
    )
    user, sql = _load_and_get_user(key)
    assert user is None and "JOIN" not in sql[0]


def test_memory_is_bounded_and_keeps_no_session_key(django_user_model, monkeypatch):
    monkeypatch.setattr(sessionuser, "MAX_SESSIONS", 3)
    users = [django_user_model.objects.create_user(f"u{i}") for i in range(5)]
    keys = [_session(user) for user in users]
    for key in keys:
        SessionStore(key).load()
    assert len(sessionuser._owners) == 3
    assert not any(isinstance(k, str) for k in sessionuser._owners)
    assert list(sessionuser._owners.values()) == [u.pk for u in users[2:]]


def test_get_joined_reports_what_it_found(django_user_model):
    alice = django_user_model.objects.create_user("alice")
    key = _session(alice)
    later = ("expire_date", timezone.now())
    row, user = keyread.get_joined(
        Session, "default", "session_key", key, later, django_user_model, alice.pk
    )
    assert row.session_key == key and user.username == "alice"
    row, user = keyread.get_joined(
        Session, "default", "session_key", key, later, django_user_model, alice.pk + 99
    )
    assert row.session_key == key and user is None
    row, user = keyread.get_joined(
        Session, "default", "session_key", "n" * 32, later, django_user_model, alice.pk
    )
    assert row is None and user is keyread.NOT_READ
    with pytest.raises(ValueError, match="itself"):
        keyread.get_joined(Session, "default", "session_key", key, later, Session, key)


def test_signed_in_requests_read_one_statement_fewer(client, django_user_model):
    """The site's settings, through Django's test client: from the second request on,
    the session and the user are one statement; signing out still signs out."""
    alice = django_user_model.objects.create_user("alice", password="pw")
    client.force_login(alice)
    counts = []
    for _ in range(3):
        with CaptureQueriesContext(connection) as queries:
            assert client.get("/api/inference/tool-approvals").status_code == 200
        counts.append(len(queries))
    assert counts[1] == counts[2] == counts[0] - 1
    alice.set_password("new")
    alice.save()
    assert client.get("/api/inference/tool-approvals").status_code in (401, 403)
