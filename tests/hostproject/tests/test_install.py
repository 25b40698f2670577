"""The app as installed in this project: where it comes from, what it ships, what it checks."""

from __future__ import annotations

import importlib.util
import os
import sysconfig
import uuid
from pathlib import Path

import pytest
from django.conf import settings
from django.core import checks
from django.test import override_settings

import approvals

FROM_WHEEL = os.environ.get("HOSTPROJECT_FROM_WHEEL") == "1"
PACKAGE = Path(approvals.__file__).resolve().parent


@pytest.mark.skipif(not FROM_WHEEL, reason="only run_from_wheel.sh installs the wheel")
def test_approvals_is_imported_from_site_packages_not_the_source_tree():
    site = Path(sysconfig.get_paths()["purelib"]).resolve()
    assert PACKAGE.is_relative_to(site), f"approvals imported from {PACKAGE}, not {site}"
    assert importlib.util.find_spec("toolgate_site") is None


def test_the_installed_package_ships_templates_static_migrations_and_types():
    assert (PACKAGE / "py.typed").is_file()
    assert (PACKAGE / "migrations" / "0001_initial.py").is_file()
    assert any((PACKAGE / "templates" / "approvals").rglob("*.html"))
    assert any((PACKAGE / "static" / "approvals").rglob("*.js"))
    assert any((PACKAGE / "templates" / "admin").rglob("*.html"))
    assert (PACKAGE / "openapi.json").is_file()


def test_host_uses_its_own_user_model_and_no_approvals_setting(django_user_model):
    assert settings.AUTH_USER_MODEL == "people.User"
    assert django_user_model.USERNAME_FIELD == "email"
    assert not any(f.name == "username" for f in django_user_model._meta.get_fields())
    assert isinstance(django_user_model._meta.pk.default(), uuid.UUID)
    assert not hasattr(settings, "APPROVALS")


def _app_messages():
    # Every app check reads settings only: a plain ``check`` reports them all.
    found = checks.run_checks()
    return {m.id for m in found if m.id.startswith("approvals.")}


@pytest.mark.django_db
@override_settings(DEBUG=True)
def test_default_sqlite_settings_get_the_apps_warnings_and_nothing_else():
    assert _app_messages() == {"approvals.W002", "approvals.W003"}


@pytest.mark.django_db
@override_settings(DEBUG=False)
def test_in_memory_layer_without_debug_is_warned_about():
    assert _app_messages() == {"approvals.W001", "approvals.W002", "approvals.W003"}


@pytest.mark.django_db
def test_no_errors_from_the_host_configuration():
    errors = [m for m in checks.run_checks(databases=["default"]) if m.level >= checks.ERROR]
    assert errors == []


@pytest.mark.django_db
@override_settings(DEBUG=True, CHANNEL_LAYERS={})
def test_a_host_without_a_channel_layer_is_told_so():
    assert _app_messages() == {"approvals.W002", "approvals.W003", "approvals.W004"}


@pytest.mark.django_db
@override_settings(APPROVALS={"DECISION_TIMEOUT": 60, "NO_SUCH_KEY": 1})
def test_a_typo_in_a_host_setting_is_an_error():
    assert "approvals.E001" in _app_messages()
