# ruff: noqa: F811  (pytest fixtures imported from tests.test_browser)
"""The page per call, notifications and agent-key cards, in a real Chromium and daphne."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from approvals.decisions import decide
from approvals.models import Status, Via
from tests.test_browser import (  # noqa: F401  (fixtures)
    CHROMIUM,
    PASSWORD,
    _card,
    _sign_in,
    agent,
    browser,
    server,
    user,
)

ROOT = Path(__file__).resolve().parent.parent
PHONE_SHOT = ROOT / "docs" / "review-phone.png"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"needs chromium at {CHROMIUM}"),
]
sync_api = pytest.importorskip("playwright.sync_api", reason="needs Playwright for Python")
expect = sync_api.expect


def _phone(browser, server, username: str = "browser"):
    context = browser.new_context(
        viewport={"width": 390, "height": 844}, device_scale_factor=2, is_mobile=True
    )
    page = context.new_page()
    page.set_default_timeout(8000)
    page.errors = []
    page.on("pageerror", lambda exc: page.errors.append(str(exc)))
    page.goto(f"{server.url}/accounts/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url("**/approvals/")
    return page


def _shot_path(tmp_path: Path) -> Path:
    if os.environ.get("TOOLGATE_UPDATE_SCREENSHOT") or not PHONE_SHOT.exists():
        return PHONE_SHOT
    return tmp_path / "review-phone.png"


def test_the_review_page_on_a_phone(server, agent, browser, user, django_user_model, tmp_path):
    server.wait()
    page = _phone(browser, server)
    aid = agent.gate("send_email", {"to": ["ops@example.com"], "subject": "Nightly report"})
    page.goto(f"{server.url}/approvals/{aid}/")
    expect(page.get_by_role("heading", name="send_email")).to_be_visible()
    expect(page.locator(".args")).to_contain_text('"subject": "Nightly report"')
    expect(page.locator("#conn")).to_have_attribute("data-state", "live")
    page.screenshot(path=str(_shot_path(tmp_path)), full_page=True)
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390, f"the page scrolls sideways ({width}px)"
    page.get_by_role("button", name="Allow", exact=True).click()
    assert agent.answer(aid)[0] == "allow"
    expect(page.locator("#review-state")).to_have_text("Allowed")
    expect(page.locator("#outcome")).to_contain_text("by browser via web")

    # Decided elsewhere while the page is open: the page follows.
    other = agent.gate("delete_path", {"path": "build/"})
    page.goto(f"{server.url}/approvals/{other}/")
    expect(page.locator("#conn")).to_have_attribute("data-state", "live")
    assert decide(other, Status.DENIED, via=Via.ADMIN, by=user, reason="not today").won
    expect(page.locator("#review-state")).to_have_text("Denied", timeout=6000)
    expect(page.locator("#outcome")).to_contain_text("not today")

    # Deny with a reason, from the page.
    third = agent.gate("run_shell", {"command": "rm -rf tmp"})
    page.goto(f"{server.url}/approvals/{third}/")
    page.get_by_role("button", name="Deny with reason…").click()
    page.get_by_role("textbox").fill("Use the cleanup task instead.")
    page.get_by_role("button", name="Send denial").click()
    assert agent.answer(third)[0] == "deny"
    expect(page.locator("#outcome")).to_contain_text("Use the cleanup task instead.")
    assert page.errors == []

    # Another user (no permission to decide others' calls) gets the same 404 as unknown.
    stranger = django_user_model.objects.create_user("stranger")
    stranger.password = django_user_model.objects.get(pk=user.pk).password
    stranger.save(update_fields=["password"])
    theirs = _phone(browser, server, "stranger")
    response = theirs.goto(f"{server.url}/approvals/{aid}/")
    assert response.status == 404
    assert theirs.goto(f"{server.url}/approvals/no-such-call/").status == 404


def test_the_review_page_edits_an_editable_call_before_allowing_it(server, agent, browser):
    server.wait()
    page = _phone(browser, server)
    schema = {
        "type": "object",
        "properties": {"paths": {"type": "array", "items": {"type": "string"}}},
        "required": ["paths"],
    }
    aid = agent.agent.gate(
        "run-1",
        user_id=agent.user_id,
        tool_name="delete_paths",
        arguments={"paths": ["build", "logs"]},
        description="Free disk space \u202eexe.txt",
        editable=True,
        arguments_schema=schema,
    )
    page.goto(f"{server.url}/approvals/{aid}/")
    expect(page.locator(".review-description")).to_contain_text("⟨U+202E⟩")
    page.get_by_role("button", name="Edit", exact=True).click()
    editor = page.locator("#edit-form textarea")
    editor.fill('{"paths": "build"}')
    expect(page.locator("#edit-form .edit-error")).to_contain_text("$.paths")
    editor.fill('{"paths": ["build"]}')
    expect(page.locator("#edit-form .edit-error")).to_be_hidden()
    page.get_by_role("button", name="Allow with changes", exact=True).click()
    line = agent.agent.answer(aid, 20)
    assert line["answer"] == "allow"
    assert line["arguments"] == {"paths": ["build"]}
    expect(page.locator("#review-state")).to_have_text("Allowed")
    expect(page.locator("pre.args").last).to_contain_text('"build"')
    # A call gated without editable=True offers no Edit.
    plain = agent.gate("run_shell", {"command": "ls"})
    page.goto(f"{server.url}/approvals/{plain}/")
    expect(page.get_by_role("button", name="Allow", exact=True)).to_be_visible()
    assert page.get_by_role("button", name="Edit", exact=True).count() == 0
    assert page.errors == []


def _until(page, expression: str, seconds: float = 10) -> None:
    """Poll ``expression`` with evaluate (the page's CSP forbids wait_for_function's eval)."""
    deadline = time.monotonic() + seconds
    while not page.evaluate(expression):
        assert time.monotonic() < deadline, f"never true: {expression}"
        page.wait_for_timeout(50)


INIT = """
(() => {
  const Real = window.Notification;
  window.__notes = [];
  window.__realCalls = 0;
  class Recording extends Real {
    constructor(title, options) {
      super(title, options);
      window.__realCalls += 1;
      window.__notes.push({ title, options, note: this });
    }
  }
  Object.defineProperty(window, "Notification", { value: Recording, configurable: true });
  Object.defineProperty(document, "visibilityState", {
    get: () => (window.__hidden ? "hidden" : "visible"),
    configurable: true,
  });
})();
"""


def test_notify_me_raises_a_notification_while_hidden(server, agent, browser, user):
    page = _sign_in(browser, server)
    context = page.context
    context.grant_permissions(["notifications"], origin=server.url)
    context.add_init_script(INIT)
    page.reload()
    expect(page.locator("#conn")).to_have_attribute("data-state", "live")
    button = page.get_by_role("button", name="Notify me")
    expect(button).to_be_visible()
    button.click()
    expect(button).to_have_attribute("aria-pressed", "true")

    seen = agent.gate("run_shell", {"command": "ls"})  # tab visible: no notification
    expect(_card(page, seen)).to_be_visible()
    page.evaluate("window.__hidden = true")
    hidden = agent.gate("deploy", {"env": "prod"}, session_id="run-9")
    expect(_card(page, hidden)).to_be_visible()
    _until(page, "window.__notes.length === 1")
    note = page.evaluate("({title: __notes[0].title, body: __notes[0].options.body})")
    assert note["title"] == "deploy is waiting for you"
    assert "run-9" in note["body"]
    assert page.evaluate("window.__realCalls") == 1
    assert page.evaluate("Notification.permission") == "granted"

    page.evaluate("window.__hidden = false; document.activeElement.blur()")
    page.evaluate("window.__notes[0].note.onclick()")
    expect(_card(page, hidden)).to_be_focused()
    assert page.errors == []


def test_a_call_gated_with_an_agent_key_names_the_key_on_its_card(server, browser, user):
    import json
    import urllib.request

    from approvals.agentkeys import create_key
    from tests.test_browser import _sign_in

    page = _sign_in(browser, server)
    _key, raw = create_key(user, "ci-bot")
    body = json.dumps({"session_id": "ci-1", "tool_name": "deploy", "arguments": {"env": "prod"}})
    request = urllib.request.Request(
        f"{server.url}/api/inference/approvals",
        data=body.encode(),
        headers={"Authorization": f"Bearer {raw}", "Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 201
        aid = json.loads(response.read())["approval_id"]
    card = _card(page, aid)
    expect(card).to_be_visible(timeout=15000)
    expect(card.locator(".agent-row")).to_be_visible()
    expect(card.locator(".agent")).to_have_text("ci-bot")
    assert page.errors == []
