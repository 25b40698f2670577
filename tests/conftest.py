"""Shared fixtures: the live test database for other processes, and a clean listener."""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path
from urllib.parse import quote

import pytest

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("TOOLGATE_QUIET", "1")


@pytest.fixture(scope="session", autouse=True)
def _stop_listener_before_db_teardown(django_db_setup, django_db_blocker):
    """The listener's threads hold connections; close them before the test DB is dropped."""
    yield
    from approvals import listener

    listener.shutdown()
    _drop_other_connections(django_db_blocker)


@pytest.fixture(scope="session", autouse=True)
def _production_mode():
    """Run every child process (daphne, agents) as deployed: ``DJANGO_DEBUG=0`` with a
    secret key of this run's own, which this process signs its sessions with too, so a
    session made here is valid in a child."""
    from django.test import override_settings

    key = "toolgate-tests-" + secrets.token_urlsafe(32)
    saved = {name: os.environ.get(name) for name in ("DJANGO_SECRET_KEY", "DJANGO_DEBUG")}
    os.environ.update(DJANGO_SECRET_KEY=key, DJANGO_DEBUG="0")
    with override_settings(SECRET_KEY=key):
        yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="session", autouse=True)
def _collected_static():
    """The site's pages name their static files by hash with DEBUG off (pytest-django's
    default, and every daphne child): collect them unless ``make`` has done so since
    the last change to a static file."""
    from django.conf import settings
    from django.contrib.staticfiles import finders, storage
    from django.core.management import call_command
    from django.utils.functional import empty

    manifest = Path(settings.STATIC_ROOT) / "staticfiles.json"
    sources = [
        os.path.getmtime(store.path(path))
        for finder in finders.get_finders()
        for path, store in finder.list(["CVS", ".*", "*~"])
    ]
    if not manifest.exists() or manifest.stat().st_mtime < max(sources, default=0):
        call_command("collectstatic", interactive=False, verbosity=0)
        storage.staticfiles_storage._wrapped = empty  # reload the new manifest


@pytest.fixture(autouse=True)
def _fresh_rule_cache():
    """Rules an earlier test cached (then rolled back or flushed) must not answer this
    test's calls: every test starts with this process's rule cache empty."""
    from approvals import rules

    rules.invalidate(local_only=True)
    yield


def _drop_other_connections(django_db_blocker) -> None:
    """Close connections other threads left open (e.g. asgiref's executor) so the test
    database can be dropped."""
    from django.db import connection

    if connection.vendor != "postgresql":
        return
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )


def database_url() -> str:
    """A URL for the test database as it exists now (for child processes)."""
    from django.db import connection

    s = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{Path(s['NAME']).resolve()}"
    if connection.vendor == "postgresql":
        auth = quote(s["USER"] or "")
        if s.get("PASSWORD"):
            auth += ":" + quote(s["PASSWORD"])
        host = s.get("HOST") or "127.0.0.1"
        port = s.get("PORT") or 5432
        return f"postgres://{auth}@{host}:{port}/{s['NAME']}"
    raise RuntimeError(f"no URL for {connection.vendor}")


@pytest.fixture
def child_env(transactional_db) -> dict:
    """Environment for a separate process that must use this test database."""
    env = {**os.environ, "DATABASE_URL": database_url(), "TOOLGATE_QUIET": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["DJANGO_SETTINGS_MODULE"] = "toolgate_site.settings"
    return env


@pytest.fixture
def python() -> str:
    return sys.executable


def requires_postgres():
    """Skip unless the suite runs on PostgreSQL (``make test-services``; .ci/run does)."""
    from django.conf import settings

    engine = settings.DATABASES["default"]["ENGINE"]
    return pytest.mark.skipif(
        not os.environ.get("TOOLGATE_TEST_DATABASE_URL") or "postgresql" not in engine,
        reason="runs on PostgreSQL: set TOOLGATE_TEST_DATABASE_URL and DATABASE_URL "
        "(make test-services; .ci/run does)",
    )


def requires_redis():
    return pytest.mark.skipif(
        not os.environ.get("TOOLGATE_TEST_REDIS_URL"),
        reason="set TOOLGATE_TEST_REDIS_URL (Redis) to run; .ci/run does",
    )
