"""The app's migrations against the host's swapped user model."""

from __future__ import annotations

from io import StringIO

import pytest
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.db import connection

pytestmark = pytest.mark.django_db(transaction=True)


def _tables() -> set[str]:
    return set(connection.introspection.table_names())


def test_migrations_apply_from_zero_and_forward_again():
    call_command("migrate", "approvals", "zero", verbosity=0)
    assert not {"approvals_approval", "approvals_rule"} & _tables()

    call_command("migrate", "approvals", verbosity=0)
    assert {"approvals_approval", "approvals_rule", "approvals_processlease"} <= _tables()
    with connection.cursor() as cursor:
        relations = connection.introspection.get_relations(cursor, "approvals_approval")
    assert relations["user_id"][:2] == ("id", "people_user")
    assert relations["decided_by_id"][:2] == ("id", "people_user")
    assert Permission.objects.filter(
        content_type__app_label="approvals", codename="decide_approval"
    ).exists()


def test_makemigrations_finds_nothing_to_do():
    out = StringIO()
    call_command("makemigrations", "--check", "--dry-run", stdout=out, stderr=out)
    assert "No changes detected" in out.getvalue()
