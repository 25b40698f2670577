"""The inbox page at the host's ``/review/``: every endpoint it names is the host's."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.staticfiles import finders
from django.test import Client

from approvals import gate

pytestmark = pytest.mark.django_db(transaction=True)


class _Attributes(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.data: dict[str, str] = {}
        self.assets: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.data.update({k: v or "" for k, v in attrs.items() if k.startswith("data-")})
        if tag in ("script", "link") and (attrs.get("src") or attrs.get("href")):
            self.assets.append(attrs.get("src") or attrs.get("href"))


def _page(user, query=""):
    client = Client()
    client.force_login(user)
    response = client.get("/review/" + query)
    parser = _Attributes()
    parser.feed(response.content.decode())
    return response, parser


def test_inbox_renders_with_the_hosts_endpoints(alice):
    response, page = _page(alice)
    assert response.status_code == 200
    assert page.data["data-confirm-url"] == "/agent-gate/v1/tool-confirm"
    assert page.data["data-pending-url"] == "/agent-gate/v1/tool-approvals"
    assert page.data["data-websocket-url"] == "/realtime/gate/approvals/"
    assert page.data["data-rules-url"] == "/agent-gate/v1/rules"
    placeholder = page.data["data-rule-id-placeholder"]
    assert page.data["data-rule-revoke-url"] == f"/agent-gate/v1/rules/{placeholder}/revoke"
    assert page.data["data-username"] == "alice@example.com"
    for key, value in page.data.items():
        for foreign in ("/api/inference", "/ws/approvals", "/admin/"):
            assert foreign not in value, (key, value)


def test_inbox_assets_are_served_from_the_installed_app(alice):
    _response, page = _page(alice)
    assets = [a for a in page.assets if a.startswith(settings.STATIC_URL) or "/static/" in a]
    assert assets, page.assets
    names = [url.split("static/", 1)[1] for url in assets]
    while names:
        name = names.pop()
        found = finders.find(name)
        assert found, f"{name} is not in any installed app's static folder"
        if name.endswith(".js"):  # the module's own imports are relative to it
            folder = name.rsplit("/", 1)[0]
            text = Path(found).read_text(encoding="utf-8")
            names += [f"{folder}/{m}" for m in re.findall(r'from "\./([\w.-]+\.js)"', text)]


def test_inbox_shows_history_with_the_hosts_users(alice, reviewer):
    aid = gate.new_approval_id()
    slot = gate.begin_tool_decision("page-run", aid, tool_name="send_email", user=alice)
    assert gate.resolve_tool_decision(aid, "deny", user=reviewer, reason="not now")
    gate.wait_tool_decision(slot, aid)
    response, _page_data = _page(alice, "?session_id=page-run")
    body = response.content.decode()
    assert "send_email" in body and "reviewer@example.com" in body


def test_anonymous_visitors_go_to_the_hosts_login_page():
    response = Client().get("/review/")
    assert response.status_code == 302
    assert response["Location"].startswith(settings.LOGIN_URL + "?next=/review/")


def test_an_explicit_websocket_url_wins(alice):
    from django.test import override_settings

    with override_settings(APPROVALS={"INBOX_WEBSOCKET_URL": "wss://live.example.com/gate/"}):
        _response, page = _page(alice)
    assert page.data["data-websocket-url"] == "wss://live.example.com/gate/"


def test_the_shipped_scripts_hard_code_no_site_prefix():
    import approvals

    scripts = list((Path(approvals.__file__).parent / "static").rglob("*.js"))
    assert scripts
    for script in scripts:
        text = script.read_text(encoding="utf-8")
        for prefix in ("/api/inference", "/admin/"):
            assert prefix not in text, f"{script.name} names {prefix}"
