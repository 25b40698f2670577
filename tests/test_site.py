"""The site as deployed: settings read from the environment, static files served by daphne."""

from __future__ import annotations

import gzip
import http.client
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.staticfiles import finders
from django.contrib.staticfiles.storage import staticfiles_storage

from tests import procs

ROOT = Path(__file__).resolve().parent.parent
PROBE = (
    "import warnings; warnings.simplefilter('always')\n"
    "from toolgate_site import settings\n"
    "print('DEBUG', settings.DEBUG)\n"
)
YEAR = 365 * 24 * 3600


def _settings_in_child(**env: str) -> subprocess.CompletedProcess:
    """Import the site's settings in a fresh interpreter with only ``env`` set."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "TOOLGATE_"))}
    return subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=ROOT,
        env={**clean, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


# -- DJANGO_SECRET_KEY and DJANGO_DEBUG ----------------------------------------


def test_debug_off_without_a_secret_key_refuses_to_start():
    out = _settings_in_child(DJANGO_DEBUG="0")
    assert out.returncode != 0
    assert "django.core.exceptions.ImproperlyConfigured" in out.stderr
    assert "DJANGO_DEBUG=0 needs a secret key of its own: set DJANGO_SECRET_KEY" in out.stderr
    assert "DEBUG" not in out.stdout


def test_debug_off_refuses_the_public_development_key_and_an_empty_one():
    from toolgate_site.settings import _DEV_SECRET

    for key in (_DEV_SECRET, ""):
        out = _settings_in_child(DJANGO_DEBUG="0", DJANGO_SECRET_KEY=key)
        assert out.returncode != 0, key
        assert "set DJANGO_SECRET_KEY" in out.stderr


def test_debug_off_refusal_stops_daphne_too():
    out = subprocess.run(
        [sys.executable, "-m", "daphne", "toolgate_site.asgi:application", "-p", "0"],
        cwd=ROOT,
        env={
            **{k: v for k, v in os.environ.items() if k != "DJANGO_SECRET_KEY"},
            "DJANGO_DEBUG": "0",
            "DJANGO_SETTINGS_MODULE": "toolgate_site.settings",
            "PYTHONPATH": str(ROOT),
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0
    assert "set DJANGO_SECRET_KEY" in out.stderr


def test_nothing_set_is_development_with_a_warning():
    out = _settings_in_child()
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "DEBUG True"
    assert "DJANGO_SECRET_KEY is not set: using the public development key" in out.stderr

    quiet = _settings_in_child(TOOLGATE_QUIET="1")
    assert quiet.returncode == 0 and quiet.stdout.strip() == "DEBUG True"
    assert "DJANGO_SECRET_KEY" not in quiet.stderr


def test_a_secret_key_alone_means_production_and_debug_can_be_forced_on():
    key = "a-long-random-key-for-this-test-only-0123456789"
    out = _settings_in_child(DJANGO_SECRET_KEY=key)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "DEBUG False"
    assert "DJANGO_SECRET_KEY" not in out.stderr
    debug = _settings_in_child(DJANGO_SECRET_KEY=key, DJANGO_DEBUG="1")
    assert debug.stdout.strip() == "DEBUG True"
    dev = _settings_in_child(DJANGO_DEBUG="1")  # development on purpose: allowed, warned
    assert dev.returncode == 0 and dev.stdout.strip() == "DEBUG True"
    assert "DJANGO_SECRET_KEY is not set" in dev.stderr


# -- static files under a real daphne with DJANGO_DEBUG=0 ----------------------------


def _get(server, path: str, encoding: str = "") -> tuple[int, dict, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request("GET", path, headers={"Accept-Encoding": encoding} if encoding else {})
        response = conn.getresponse()
        headers = {k.lower(): v for k, v in response.getheaders()}
        return response.status, headers, response.read()
    finally:
        conn.close()


def _max_age(headers: dict) -> int:
    match = re.search(r"max-age=(\d+)", headers.get("cache-control", ""))
    return int(match.group(1)) if match else 0


@pytest.fixture
def production_site(child_env):
    assert child_env["DJANGO_DEBUG"] == "0" and child_env["DJANGO_SECRET_KEY"]
    server = procs.wait_ready(procs.start_daphne(child_env))
    yield server
    server.stop()


def test_daphne_with_debug_off_serves_the_inbox_script(production_site):
    source = Path(finders.find("approvals/inbox.js")).read_bytes()

    status, headers, body = _get(production_site, "/static/approvals/inbox.js")
    assert status == 200
    assert body == source and "content-encoding" not in headers
    assert headers["content-type"].startswith("text/javascript")
    assert "Accept-Encoding" in headers["vary"]
    # An unhashed name may change under the same URL: cached briefly, never "immutable".
    assert 0 < _max_age(headers) <= 600 and "immutable" not in headers["cache-control"]

    status, headers, body = _get(production_site, "/static/approvals/inbox.js", "gzip")
    assert status == 200 and headers["content-encoding"] == "gzip"
    assert gzip.decompress(body) == source

    brotli = pytest.importorskip("brotli")
    status, headers, body = _get(production_site, "/static/approvals/inbox.js", "gzip, br")
    assert status == 200 and headers["content-encoding"] == "br"
    assert brotli.decompress(body) == source


def test_the_names_pages_use_are_hashed_compressed_and_cached_for_a_year(production_site):
    # What {% static %} puts in the page (the test process reads the same manifest).
    script = staticfiles_storage.url("approvals/inbox.js")
    assert re.fullmatch(r"/static/approvals/inbox\.[0-9a-f]{12}\.js", script)
    status, headers, body = _get(production_site, script, "gzip")
    assert status == 200 and headers["content-encoding"] == "gzip"
    assert _max_age(headers) >= YEAR and "immutable" in headers["cache-control"]
    # Its module imports name hashed files too, so no part of the inbox is stale.
    imports = re.findall(rb'from "\./([^"]+)"', gzip.decompress(body))
    hashed = rb"inbox-(live|view|edit)\.[0-9a-f]{12}\.js"
    assert imports and all(re.fullmatch(hashed, name) for name in imports)
    for name in imports:
        status, headers, _ = _get(production_site, f"/static/approvals/{name.decode()}")
        assert status == 200 and _max_age(headers) >= YEAR

    # The admin's login page links its CSS under hashed names, served the same way.
    status, _, page = _get(production_site, "/admin/login/")
    assert status == 200
    css = re.search(rb'href="(/static/admin/css/base\.[0-9a-f]{12}\.css)"', page)
    assert css, page[:500]
    status, headers, body = _get(production_site, css.group(1).decode(), "br, gzip")
    assert status == 200 and headers["content-encoding"] in ("br", "gzip")
    assert headers["content-type"].startswith("text/css")
    assert _max_age(headers) >= YEAR and "immutable" in headers["cache-control"]

    # The site's own pages link the inbox styles by hash.
    status, _, login = _get(production_site, "/accounts/login/")
    assert status == 200
    assert re.search(rb'href="/static/approvals/inbox\.[0-9a-f]{12}\.css"', login)

    assert _get(production_site, "/static/approvals/nothing-here.js")[0] == 404


# -- manage.py check --deploy, as the README explains it -------------------------------


def _check_deploy(**env: str) -> set[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "REDIS_URL"))}
    key = "a-long-random-key-for-this-test-only-0123456789-abcdefghijklmnop"
    out = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy"],
        cwd=ROOT,
        env={**clean, "DJANGO_DEBUG": "0", "DJANGO_SECRET_KEY": key, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return set(re.findall(r"\((\w+\.[WE]\d+)\)", out.stdout + out.stderr))


def test_check_deploy_reports_only_what_the_readme_explains():
    assert _check_deploy() == {"security.W004", "security.W008", "approvals.W001"}
    https = {"DJANGO_SECURE_SSL_REDIRECT": "1", "DJANGO_HSTS_SECONDS": "31536000"}
    assert _check_deploy(**https) == {"security.W005", "security.W021", "approvals.W001"}
    https |= {"DJANGO_HSTS_INCLUDE_SUBDOMAINS": "1", "DJANGO_HSTS_PRELOAD": "1"}
    # The layer is only configured here, never reached: checks read settings.
    assert _check_deploy(**https, REDIS_URL="redis://127.0.0.1:1/0") == set()
