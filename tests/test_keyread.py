"""Sessions and users read with a composed statement (``approvals.keyread``): the same
objects Django's ORM gives, the same answers for expired, unknown and inactive,
one query each, and the ORM still used wherever the composed read could differ."""

from __future__ import annotations

from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY, get_user_model
from django.contrib.auth import backends as django_backends
from django.contrib.sessions.backends.db import SessionStore as DjangoStore
from django.contrib.sessions.models import Session
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from approvals import keyread
from approvals import sessions as sessions_module
from approvals.agentkeys import create_key
from approvals.backends import ModelBackend
from approvals.models import AgentKey, Approval
from approvals.sessions import SessionStore

pytestmark = pytest.mark.django_db(transaction=True)


def _fields(obj) -> dict:
    return {f.attname: getattr(obj, f.attname) for f in type(obj)._meta.concrete_fields}


def test_an_approval_row_reads_as_the_orm_reads_it(django_user_model):
    """Every field type the app stores (JSON, datetimes, keys, booleans, text)."""
    alice = django_user_model.objects.create_user("alice")
    key, _ = create_key(alice, "bot")
    now = timezone.now()
    Approval.objects.create(
        approval_id="a1",
        user=alice,
        agent_key=key,
        tool_name="shell",
        arguments={"cmd": "ls", "n": [1, 2.5, None, True], "é": "✓"},
        arguments_schema={"type": "object"},
        editable=True,
        expires_at=now + timedelta(hours=1),
    )
    orm = Approval.objects.get(approval_id="a1")
    read = keyread.get(Approval, "default", "approval_id", "a1")
    assert type(read) is Approval and _fields(read) == _fields(orm)
    assert read._state.db == "default" and not read._state.adding
    assert read.get_deferred_fields() == set()
    assert keyread.get(AgentKey, "default", "pk", key.pk).name == "bot"
    assert keyread.get(Approval, "default", "approval_id", "nothing") is None


def test_a_later_than_condition_is_strict():
    now = timezone.now()
    Approval.objects.create(approval_id="t", expires_at=now)
    assert keyread.get(Approval, "default", "approval_id", "t", ("expires_at", now)) is None
    before = now - timedelta(microseconds=1)
    assert keyread.get(Approval, "default", "approval_id", "t", ("expires_at", before)) is not None


def test_only_unique_keys_and_single_table_models():
    with pytest.raises(ValueError, match="not unique"):
        keyread.get(Approval, "default", "tool_name", "shell")
    assert keyread.composable(Approval) and keyread.composable(Session)
    assert keyread.composable(get_user_model())


def _signed_in_session(user, store_class=SessionStore, backend="approvals.backends.ModelBackend"):
    store = store_class()
    store[SESSION_KEY] = str(user.pk)
    store[BACKEND_SESSION_KEY] = backend
    store[HASH_SESSION_KEY] = user.get_session_auth_hash()
    store["extra"] = {"n": 1, "s": "✓"}
    store.create()
    return store.session_key


def test_sessions_are_shared_with_djangos_engine(django_user_model):
    alice = django_user_model.objects.create_user("alice")
    ours = _signed_in_session(alice)
    theirs = _signed_in_session(alice, DjangoStore)
    assert DjangoStore(ours).load() == SessionStore(ours).load()
    assert SessionStore(theirs).load() == DjangoStore(theirs).load()
    assert SessionStore(theirs).load()["extra"] == {"n": 1, "s": "✓"}


def test_expired_and_unknown_sessions_are_empty_and_forget_their_key(django_user_model):
    alice = django_user_model.objects.create_user("alice")
    key = _signed_in_session(alice)
    Session.objects.filter(session_key=key).update(expire_date=timezone.now())
    for missing in (key, "x" * 32):
        store = SessionStore(missing)
        assert store.load() == {} and store.session_key is None
    assert SessionStore(None).load() == {}


def test_a_session_is_one_query(django_user_model):
    key = _signed_in_session(django_user_model.objects.create_user("alice"))
    with CaptureQueriesContext(connection) as queries:
        SessionStore(key).load()
    assert len(queries) == 1
    assert "django_session" in queries[0]["sql"]


def test_async_session_load_and_user(django_user_model):
    alice = django_user_model.objects.create_user("alice")
    key = _signed_in_session(alice)
    assert async_to_sync(SessionStore(key).aload)()[SESSION_KEY] == str(alice.pk)
    assert async_to_sync(SessionStore("y" * 32).aload)() == {}
    assert async_to_sync(ModelBackend().aget_user)(alice.pk).username == "alice"


def test_get_user_gives_the_orms_user(django_user_model):
    alice = django_user_model.objects.create_user("alice", "a@example.com", "pw", is_staff=True)
    with CaptureQueriesContext(connection) as queries:
        read = ModelBackend().get_user(alice.pk)
    assert len(queries) == 1
    orm = django_backends.ModelBackend().get_user(alice.pk)
    assert type(read) is django_user_model and _fields(read) == _fields(orm)
    assert read.check_password("pw") and read.has_perm("anything") is False
    assert ModelBackend().get_user(alice.pk + 1000) is None
    assert ModelBackend().get_user(str(alice.pk)).pk == alice.pk


def test_an_inactive_user_is_nobody(django_user_model):
    bob = django_user_model.objects.create_user("bob", is_active=False)
    assert ModelBackend().get_user(bob.pk) is None


def test_a_narrowing_default_manager_is_obeyed(django_user_model, monkeypatch):
    """A manager that hides users (here: everyone but carol) is used as it is."""
    carol = django_user_model.objects.create_user("carol")
    dave = django_user_model.objects.create_user("dave")
    manager = django_user_model._default_manager
    plain = type(manager).get_queryset
    monkeypatch.setattr(
        type(manager), "get_queryset", lambda self: plain(self).filter(username="carol")
    )
    assert ModelBackend().get_user(carol.pk).username == "carol"
    assert ModelBackend().get_user(dave.pk) is None


def test_signed_in_requests_use_the_composed_reads(client, django_user_model):
    """The site's own settings: a signed-in request costs one session and one user read,
    and signing out (the session row deleted) signs the cookie out."""
    alice = django_user_model.objects.create_user("alice", password="pw")
    client.force_login(alice)
    with CaptureQueriesContext(connection) as queries:
        response = client.get("/api/inference/tool-approvals")
    assert response.status_code == 200
    reads = ((Session, "session_key", "expire_date"), (django_user_model, "pk", None))
    for model, key, later in reads:
        composed = keyread._statement(model, "default", key, later).sql.partition(" = %s")[0]
        assert [q["sql"].startswith(composed) for q in queries].count(True) == 1
    Session.objects.all().delete()
    assert client.get("/api/inference/tool-approvals").status_code in (401, 403)


def test_a_password_change_signs_other_sessions_out(client, django_user_model):
    alice = django_user_model.objects.create_user("alice", password="pw")
    client.force_login(alice)
    assert client.get("/api/inference/tool-approvals").status_code == 200
    alice.set_password("new")
    alice.save()
    assert client.get("/api/inference/tool-approvals").status_code in (401, 403)


# -- decoding kept per signed string --------------------------------------------


def _signed(data: dict) -> str:
    return SessionStore().encode(data)


def test_a_decoded_session_is_kept_and_each_load_gets_its_own_copy(monkeypatch):
    from django.core import signing

    calls = []
    loads = signing.loads
    monkeypatch.setattr(signing, "loads", lambda *a, **k: calls.append(1) or loads(*a, **k))
    text = _signed({SESSION_KEY: "7", "n": 1})
    first, second = SessionStore().decode(text), SessionStore().decode(text)
    assert first == second == {SESSION_KEY: "7", "n": 1} and len(calls) == 1
    first["n"] = 2
    assert SessionStore().decode(text)["n"] == 1
    nested = _signed({"list": [1, 2]})  # values that could change in place are not kept
    SessionStore().decode(nested)["list"].append(3)
    assert SessionStore().decode(nested) == {"list": [1, 2]} and len(calls) == 3


def test_a_tampered_session_is_empty_and_never_kept():
    text = _signed({SESSION_KEY: "7"})
    tampered = text[:-1] + ("A" if text[-1] != "A" else "B")
    assert SessionStore().decode(tampered) == {}
    assert not [key for key in sessions_module._decoded if key[-1] == tampered]


def test_new_secret_keys_decode_again(settings):
    text = _signed({SESSION_KEY: "7"})
    assert SessionStore().decode(text) == {SESSION_KEY: "7"}
    old = settings.SECRET_KEY
    settings.SECRET_KEY = "another-secret-key-" + "x" * 40
    settings.SECRET_KEY_FALLBACKS = [old]
    assert SessionStore().decode(text) == {SESSION_KEY: "7"}  # signed with a fallback
    settings.SECRET_KEY_FALLBACKS = []
    assert SessionStore().decode(text) == {}  # the old key is retired: signed out
