"""The AgentKey admin: add (the key shown once), list, revoke; the hash never shown."""

from __future__ import annotations

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.messages import get_messages
from django.urls import reverse

from approvals import agentkeys
from approvals.models import AgentKey

pytestmark = pytest.mark.django_db
CHANGELIST = reverse("admin:approvals_agentkey_changelist")
ADD = reverse("admin:approvals_agentkey_add")


@pytest.fixture
def admin(client, django_user_model):
    user = django_user_model.objects.create_superuser("root", password="pw")
    client.force_login(user)
    return client


def test_add_shows_the_key_once_and_stores_only_its_hash(admin, django_user_model):
    agent_owner = django_user_model.objects.create_user("alice")
    page = admin.get(ADD).content.decode()
    assert 'name="name"' in page and 'name="user"' in page
    assert "key_hash" not in page and 'name="prefix"' not in page
    response = admin.post(ADD, {"name": "alice-bot", "user": agent_owner.pk}, follow=True)
    assert response.status_code == 200
    key = AgentKey.objects.get(name="alice-bot")
    assert key.user == agent_owner and key.revoked_at is None
    shown = [str(m) for m in get_messages(response.wsgi_request)] or [
        m.message for m in response.context["messages"]
    ]
    raw = next(w for m in shown for w in m.split() if w.startswith("tg_"))
    assert raw.startswith(f"tg_{key.prefix}_")
    assert key.key_hash not in response.content.decode()
    assert raw not in key.key_hash and agentkeys.verify(raw) == key
    # Shown once: the next page does not carry it.
    assert raw not in admin.get(CHANGELIST).content.decode()


def test_taken_name_is_a_form_error(admin, django_user_model):
    owner = django_user_model.objects.create_user("alice")
    agentkeys.create_key(owner, "bot")
    response = admin.post(ADD, {"name": "bot", "user": owner.pk})
    assert response.status_code == 200 and "already exists" in response.content.decode()
    assert AgentKey.objects.count() == 1


def test_list_and_change_page_never_show_the_hash(admin, django_user_model):
    owner = django_user_model.objects.create_user("alice")
    key, _ = agentkeys.create_key(owner, "alice-bot")
    agentkeys.verify(_)
    page = admin.get(CHANGELIST).content.decode()
    for text in ("alice-bot", key.prefix, "alice"):
        assert text in page
    assert key.key_hash not in page
    change = admin.get(reverse("admin:approvals_agentkey_change", args=[key.pk]))
    body = change.content.decode()
    assert change.status_code == 200 and key.prefix in body and key.key_hash not in body
    assert 'name="name"' not in body  # read-only once created


def test_revoke_selected(admin, django_user_model):
    owner = django_user_model.objects.create_user("alice")
    first, raw = agentkeys.create_key(owner, "one")
    second, _ = agentkeys.create_key(owner, "two")
    response = admin.post(
        CHANGELIST,
        {"action": "revoke_selected", ACTION_CHECKBOX_NAME: [first.pk, second.pk]},
        follow=True,
    )
    assert "Revoked 2 agent keys." in response.content.decode()
    assert AgentKey.objects.filter(revoked_at__isnull=False).count() == 2
    assert agentkeys.verify(raw) is None
    assert reverse("admin:approvals_agentkey_delete", args=[first.pk])
    assert (
        admin.post(reverse("admin:approvals_agentkey_delete", args=[first.pk])).status_code == 403
    )


def test_staff_without_permission_cannot_add(client, django_user_model):
    user = django_user_model.objects.create_user("staff", is_staff=True)
    client.force_login(user)
    assert client.get(ADD).status_code == 403
