"""Fixtures for the host project's tests: its own users, nothing from the main suite."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session", autouse=True)
def _stop_listener_before_db_teardown(django_db_setup, django_db_blocker):
    """The app's process listener holds connections in its threads: stop it first."""
    yield
    from approvals import listener

    listener.shutdown()


@pytest.fixture
def make_user(django_user_model):
    def make(email: str, *, perms: tuple[str, ...] = (), staff: bool = False):
        from django.contrib.auth.models import Permission

        user = django_user_model.objects.create_user(email, is_staff=staff)
        for perm in perms:
            app_label, codename = perm.split(".")
            user.user_permissions.add(
                Permission.objects.get(content_type__app_label=app_label, codename=codename)
            )
        return django_user_model.objects.get(pk=user.pk)  # fresh permission cache

    return make


@pytest.fixture
def alice(make_user):
    return make_user("alice@example.com")


@pytest.fixture
def bob(make_user):
    return make_user("bob@example.com")


@pytest.fixture
def reviewer(make_user):
    """Staff who may decide every approval (the permission the install guide grants)."""
    return make_user(
        "reviewer@example.com",
        perms=("approvals.decide_approval", "approvals.view_approval"),
        staff=True,
    )
