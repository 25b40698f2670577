"""The inbox page as the Django test client sees it (the live behaviour is in test_browser)."""

from __future__ import annotations

import io
import re
import threading
import time
from datetime import timedelta
from html import unescape
from html.parser import HTMLParser
from pathlib import Path

import pytest
from django.test import override_settings
from django.urls import reverse
from django.utils import timezone

from approvals.models import Approval
from approvals.pages import CONTENT_SECURITY_POLICY, uses_django_csp

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def user(django_user_model):
    return django_user_model.objects.create_user("ada", password="pw-ada-123")


@pytest.fixture
def page(client, user):
    client.force_login(user)
    return client


def _decided(user, approval_id, tool, status="denied", reason="", session="s1", by=None):
    now = timezone.now()
    return Approval.objects.create(
        approval_id=approval_id,
        session_id=session,
        user=user,
        tool_name=tool,
        status=status,
        decided_via="web",
        decided_by=by,
        reason=reason,
        decided_at=now,
        expires_at=now + timedelta(hours=1),
    )


def test_anonymous_visitor_is_sent_to_the_login_page(client, settings):
    response = client.get("/approvals/?session_id=abc")
    assert response.status_code == 302
    login = reverse(settings.LOGIN_URL)
    assert response["Location"].startswith(login + "?next=")
    assert "session_id" in response["Location"]


def test_login_page_signs_in_and_returns_to_the_inbox(client, user):
    response = client.get("/accounts/login/?next=/approvals/")
    assert response.status_code == 200
    assert b'name="password"' in response.content
    response = client.post(
        "/accounts/login/",
        {"username": "ada", "password": "pw-ada-123", "next": "/approvals/"},
    )
    assert response.status_code == 302
    assert response["Location"] == "/approvals/"
    assert client.get("/approvals/").status_code == 200


def test_wrong_password_shows_an_error_not_the_inbox(client, user):
    response = client.post("/accounts/login/", {"username": "ada", "password": "nope"})
    assert response.status_code == 200
    assert b'class="errors"' in response.content


def test_logout_is_a_post_and_ends_the_session(page):
    response = page.post("/accounts/logout/")
    assert response.status_code == 302
    assert page.get("/approvals/").status_code == 302


def _data(html: str, name: str) -> str:
    match = re.search(rf'data-{name}="([^"]*)"', html)
    assert match, f"data-{name} missing"
    return match.group(1)


def test_page_names_every_endpoint_it_uses(page):
    html = page.get("/approvals/").content.decode()
    assert _data(html, "websocket-url") == "/ws/approvals/"
    assert _data(html, "confirm-url") == reverse("approvals:tool-confirm")
    assert _data(html, "pending-url") == reverse("approvals:tool-approvals")
    assert _data(html, "rules-url") == reverse("approvals:rules")
    revoke = _data(html, "rule-revoke-url")
    assert _data(html, "rule-id-placeholder") in revoke
    assert revoke.replace(_data(html, "rule-id-placeholder"), "7") == reverse(
        "approvals:rule-revoke", args=[7]
    )
    assert _data(html, "csrf-token")
    assert _data(html, "login-url") == reverse("login")


def test_websocket_url_comes_from_the_setting(page, settings):
    with override_settings(APPROVALS={**settings.APPROVALS, "INBOX_WEBSOCKET_URL": "/live/x/"}):
        html = page.get("/approvals/").content.decode()
    assert _data(html, "websocket-url") == "/live/x/"


def test_session_filter_is_passed_to_the_script_and_shown(page):
    html = page.get("/approvals/", {"session_id": "run-42"}).content.decode()
    assert _data(html, "session-id") == "run-42"
    assert "Showing session <code>run-42</code>" in html


def test_an_oversized_session_filter_is_ignored(page):
    html = page.get("/approvals/", {"session_id": "x" * 300}).content.decode()
    assert _data(html, "session-id") == ""


def test_csp_header_forbids_inline_script(page):
    response = page.get("/approvals/")
    policy = response["Content-Security-Policy"]
    directives = dict(d.strip().split(" ", 1) for d in policy.split(";") if d.strip())
    assert directives["script-src"] == "'self'"
    assert "unsafe-inline" not in policy and "unsafe-eval" not in policy
    if not uses_django_csp():
        assert policy == CONTENT_SECURITY_POLICY


def _attributes(html: str) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []

    class Collect(HTMLParser):
        def handle_starttag(self, tag, attrs):
            found.extend((tag, name) for name, _ in attrs)

    Collect().feed(html)
    return found


def test_the_html_has_no_inline_script_or_event_handler(page, user):
    _decided(user, "h1", "tool<script>alert(1)</script>", reason='"><img src=x onerror=alert(1)>')
    html = page.get("/approvals/").content.decode()
    for tag in re.findall(r"<script\b[^>]*>", html, flags=re.I):
        assert re.search(r'\bsrc="[^"]+"', tag), f"inline script: {tag}"
        assert 'type="module"' in tag
    assert not re.search(r"<script\b[^>]*>(?!</script>)", html), "a script element has a body"
    handlers = [(tag, name) for tag, name in _attributes(html) if name.startswith("on")]
    assert not handlers, f"inline event handlers: {handlers}"
    assert ("img", "src") not in _attributes(html)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "javascript:" not in html


def test_history_lists_recent_decisions_of_this_user_only(page, user, django_user_model):
    other = django_user_model.objects.create_user("bob")
    _decided(user, "mine", "send_email", reason="wrong recipient", by=user)
    _decided(other, "theirs", "secret_tool")
    Approval.objects.create(
        approval_id="waiting",
        session_id="s1",
        user=user,
        tool_name="pending_tool",
        expires_at=timezone.now() + timedelta(hours=1),
    )
    html = page.get("/approvals/").content.decode()
    assert "send_email" in html and "wrong recipient" in html and "by you via web" in html
    assert ">Denied</span>" in html
    assert "secret_tool" not in html
    assert "pending_tool" not in html


def test_history_shows_the_arguments_a_call_was_allowed_with(page, user):
    edited = _decided(user, "edited", "delete_paths", status="allowed", by=user)
    Approval.objects.filter(pk=edited.pk).update(
        arguments={"paths": ["build", "logs"]}, edited_arguments={"paths": ["build"]}
    )
    plain = _decided(user, "plain", "list_files", status="allowed", by=user)
    Approval.objects.filter(pk=plain.pk).update(arguments={"path": "\u202e.", "n": 1})
    _decided(user, "refused", "drop_table", status="denied", by=user)
    html = page.get("/approvals/").content.decode()
    found = re.findall(r'data-approval-id="(\w+)"(.*?)</li>', html, re.S)
    entries = {aid: unescape(text) for aid, text in found}
    assert "entry-edited" in entries["edited"] and '"build"' in entries["edited"]
    assert "logs" not in entries["edited"]  # what ran, not what was proposed
    assert "entry-edited" not in entries["plain"] and "⟨U+202E⟩" in entries["plain"]
    assert "\u202e" not in entries["plain"]
    assert "entry-args" not in entries["refused"]  # nothing ran


def test_history_follows_the_session_filter(page, user):
    _decided(user, "a", "tool_in_s1", session="s1")
    _decided(user, "b", "tool_in_s2", session="s2")
    html = page.get("/approvals/", {"session_id": "s2"}).content.decode()
    assert "tool_in_s2" in html and "tool_in_s1" not in html


def test_staff_see_a_link_to_the_admin(page, user):
    assert 'href="/admin/"' not in page.get("/approvals/").content.decode()
    user.is_staff = True
    user.save()
    assert 'href="/admin/"' in page.get("/approvals/").content.decode()


def test_page_is_not_cached_and_refuses_post(page):
    response = page.get("/approvals/")
    assert "no-cache" in response["Cache-Control"] or "max-age=0" in response["Cache-Control"]
    assert page.post("/approvals/").status_code == 405


def test_static_assets_exist():
    from django.contrib.staticfiles import finders

    assert finders.find("approvals/inbox.css")
    for name in ("inbox.js", "inbox-live.js", "inbox-view.js", "inbox-edit.js"):
        script = finders.find(f"approvals/{name}")
        assert script, name
        source = Path(script).read_text(encoding="utf-8")
        for unsafe in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
            assert unsafe not in source, f"{name} uses {unsafe}"
        assert "/api/inference/" not in source


# -- the demo agent --------------------------------------------------------


def _answer_demo_calls(stop_after: int) -> list[str]:
    """Answer the demo agent's gated calls as they come: deny the email with a reason."""
    from approvals.gate import resolve_tool_decision

    seen: list[str] = []
    deadline = time.monotonic() + 30
    while len(seen) < stop_after and time.monotonic() < deadline:
        for row in Approval.objects.filter(status="pending").order_by("pk"):
            if row.tool_name in ("send_email", "delete_path"):
                resolve_tool_decision(row.approval_id, "deny", reason="Not on a Sunday")
            else:
                resolve_tool_decision(row.approval_id, "allow")
            seen.append(row.tool_name)
        time.sleep(0.05)
    return seen


@pytest.mark.django_db(transaction=True)
def test_demo_agent_gates_risky_calls_and_feeds_back_the_reason(django_user_model):
    from django.core.management import call_command

    django_user_model.objects.create_user("demo")
    out = io.StringIO()
    agent = threading.Thread(
        target=call_command,
        args=("run_demo_agent",),
        kwargs={"rounds": 1, "pause": 0, "stdout": out},
    )
    agent.start()
    try:
        seen = _answer_demo_calls(stop_after=4)
    finally:
        agent.join(30)
    assert not agent.is_alive()
    assert sorted(seen) == ["delete_path", "run_shell", "send_email", "write_file"]
    text = out.getvalue()
    assert "list_files" in text and "read_file" in text  # safe tools ran without asking
    assert not Approval.objects.filter(tool_name__in=["list_files", "read_file"]).exists()
    assert "allowed run_shell: 140K build; 0K logs" in text
    assert "delete_path not run; the model is told: 'The user declined" in text
    assert "Reason: Not on a Sunday" in text
    email = Approval.objects.get(tool_name="send_email")
    assert email.user.username == "demo"
    # The agent reports what actually happened, denial reason included.
    assert "- Measured the build and log folders." in email.arguments["body"]
    assert "- Left the build folder in place (Not on a Sunday)." in email.arguments["body"]
    assert "Demo agent stopped." in text


def test_demo_sandbox_refuses_paths_outside_itself():
    from toolgate_site.management.commands.run_demo_agent import Call, Sandbox

    sandbox = Sandbox()
    try:
        with pytest.raises(ValueError):
            sandbox.run(Call("delete_path", {"path": "../../etc", "recursive": True}))
        assert sandbox.run(Call("list_files", {"path": "."})) == "README.md, build/, logs/, notes/"
    finally:
        sandbox.close()
    assert not sandbox.root.exists()


def test_a_websocket_on_another_origin_is_allowed_by_the_page_policy(page, settings):
    live = "wss://live.example.com:8443/ws/approvals/"
    with override_settings(APPROVALS={**settings.APPROVALS, "INBOX_WEBSOCKET_URL": live}):
        response = page.get("/approvals/")
    assert _data(response.content.decode(), "websocket-url") == live
    if not uses_django_csp():
        policy = response["Content-Security-Policy"]
        assert "connect-src 'self' wss://live.example.com:8443;" in policy
        assert "script-src 'self';" in policy


def test_page_needs_no_request_context_processor(page, settings):
    engine = settings.TEMPLATES[0]
    processors = [p for p in engine["OPTIONS"]["context_processors"] if not p.endswith(".request")]
    templates = [{**engine, "OPTIONS": {**engine["OPTIONS"], "context_processors": processors}}]
    with override_settings(TEMPLATES=templates):
        html = page.get("/approvals/", {"session_id": "s9"}).content.decode()
    assert _data(html, "username") == "ada"
    assert '<a href="/approvals/">Show all sessions</a>' in html
