"""Daphne without Twisted's own parse of form bodies (``toolgate_site.formparse``):
the body reaches Django as sent, and Django alone parses it."""

from __future__ import annotations

import http.client
import json

import pytest
from daphne.http_protocol import WebRequest
from twisted.web import http as twisted_http
from twisted.web.test.requesthelper import DummyChannel

from tests import procs
from toolgate_site import formparse


def test_installed_the_request_never_parses_forms():
    assert formparse.install() is True
    assert formparse.install() is True  # twice is once
    request = WebRequest.__new__(WebRequest)
    twisted_http.Request.__init__(request, DummyChannel())  # Twisted sets the switch here…
    assert request._parsePOSTFormSubmission is False  # …and it stays off
    assert twisted_http.Request(DummyChannel())._parsePOSTFormSubmission is True  # others untouched


@pytest.fixture
def site(child_env):
    server = procs.wait_ready(procs.start_daphne(child_env))
    yield server
    server.stop()


def _post(server, path: str, body: bytes, content_type: str) -> tuple[int, str, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": content_type})
        response = conn.getresponse()
        return response.status, response.getheader("Content-Type", ""), response.read()
    finally:
        conn.close()


def test_a_body_twisted_would_refuse_reaches_django(site):
    """Twisted's own parser answers a broken multipart body with its 400 page before
    the application sees it; served by the site, Django answers (here: sign in first)."""
    status, content_type, body = _post(
        site,
        "/api/inference/tool-confirm",
        b"not a multipart body",
        "multipart/form-data; boundary=xyz",
    )
    assert status == 401 and content_type.startswith("application/json")
    assert json.loads(body)["error"] == "authentication_required"


def test_forms_and_json_still_arrive_whole(site):
    """A form post is parsed by Django (the admin's login answers its own CSRF 403),
    and a JSON post is read as sent."""
    status, _, body = _post(
        site, "/admin/login/", b"username=a&password=b", "application/x-www-form-urlencoded"
    )
    assert status == 403 and b"CSRF" in body
    status, _, body = _post(
        site, "/api/inference/tool-confirm", b'{"approval_id": "x"}', "application/json"
    )
    assert status == 401 and json.loads(body)["resolved"] is False
