"""The inbox in a real Chromium against a real daphne, with the agent in another process.

Skipped without Debian's ``/usr/bin/chromium``. The server and the agent are
separate processes on the live test database, as in ``make demo``: without
Redis a call reaches the page through the server's database tail (about a
second), with Redis at once.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from django.contrib.auth.hashers import PBKDF2PasswordHasher

from approvals.gate import denial_message
from tests import procs

CHROMIUM = "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parent.parent
SCREENSHOT = ROOT / "docs" / "inbox.png"
PASSWORD = "browser-pw-123"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not Path(CHROMIUM).exists(), reason=f"needs Debian's chromium at {CHROMIUM}"
    ),
]

sync_api = pytest.importorskip("playwright.sync_api", reason="needs Playwright for Python")
expect = sync_api.expect


class Site:
    """The site under daphne (tests/procs.py), restartable on the same port."""

    def __init__(self, env: dict) -> None:
        self.env = env  # as deployed: DJANGO_DEBUG=0, static files served by the site
        self.server = procs.start_daphne(self.env)
        self.url = self.server.url

    def wait(self) -> None:
        procs.wait_ready(self.server)

    def kill(self) -> None:
        self.server.proc.kill()
        self.server.proc.wait(10)

    def start(self) -> None:
        self.server = procs.wait_ready(procs.start_daphne(self.env, self.server.port))

    def stop(self) -> None:
        procs.stop_process(self.server.proc)


class AgentProcess:
    """An agent in its own process; :meth:`answer` is what its waiter got back."""

    def __init__(self, env: dict, user_id: int) -> None:
        self.agent = procs.start_agent(env)
        self.user_id = user_id

    def gate(self, tool: str, arguments: dict, session_id: str = "run-1") -> str:
        return self.agent.gate(
            session_id, user_id=self.user_id, tool_name=tool, arguments=arguments
        )

    def answer(self, approval_id: str, timeout: float = 10) -> tuple[str, str]:
        """The waiter's answer, and on deny what the model would be told."""
        answer = self.agent.answer(approval_id, timeout)["answer"]
        return answer, denial_message(approval_id) if answer == "deny" else ""


@pytest.fixture
def user(transactional_db, django_user_model, monkeypatch):
    # Playwright's sync API keeps an event loop in this thread; the ORM calls here are sync.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    # A cheap hash (the server upgrades it at sign-in): the test needs no slow hashing.
    cheap = PBKDF2PasswordHasher().encode(PASSWORD, "browsersalt", iterations=1000)
    user = django_user_model.objects.create_superuser("browser", "b@example.com")
    django_user_model.objects.filter(pk=user.pk).update(password=cheap)
    return user


@pytest.fixture
def server(child_env, user):
    site = Site(child_env)  # starts beside the agent; waited for at sign-in
    yield site
    site.stop()


@pytest.fixture
def agent(child_env, user):
    proc = AgentProcess(child_env, user.pk)
    yield proc
    proc.agent.stop()


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        chromium = p.chromium.launch(
            executable_path=CHROMIUM,
            args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        yield chromium
        chromium.close()


def _sign_in(browser, server, session_id: str = "", accept_dialogs: bool = False) -> object:
    server.wait()
    page = browser.new_context(viewport={"width": 1180, "height": 760}).new_page()
    page.set_default_timeout(8000)
    page.dialogs, page.errors = [], []
    page.on(
        "dialog",
        lambda d: (page.dialogs.append(d.message), d.accept() if accept_dialogs else d.dismiss()),
    )
    page.on("pageerror", lambda exc: page.errors.append(str(exc)))
    query = f"?session_id={session_id}" if session_id else ""
    page.goto(f"{server.url}/approvals/{query}")
    assert "/accounts/login/" in page.url
    page.get_by_label("Username").fill("browser")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(f"**/approvals/{query}")
    expect(page.locator("#conn")).to_have_attribute("data-state", "live")
    return page


def _card(page, approval_id: str):
    return page.locator(f'.card[data-approval-id="{approval_id}"]')


def _appears(page, approval_id: str, started: float, limit: float) -> float:
    expect(_card(page, approval_id)).to_be_visible(timeout=limit * 1000 + 2000)
    took = time.monotonic() - started
    assert took < limit, f"the call took {took:.2f} s to appear"
    return took


def _tail_limit() -> float:
    # With Redis a gated call is pushed at once; without it the server's
    # database tail (RECHECK_INTERVAL, 1 s) carries it.
    return 1.0 if os.environ.get("REDIS_URL") else 2.5


def _screenshot_path(tmp_path: Path) -> Path:
    # docs/inbox.png is rewritten only on request (or when missing), so a test
    # run leaves the work tree clean.
    if os.environ.get("TOOLGATE_UPDATE_SCREENSHOT") or not SCREENSHOT.exists():
        SCREENSHOT.parent.mkdir(exist_ok=True)
        return SCREENSHOT
    return tmp_path / "inbox.png"


def test_calls_appear_live_and_answers_reach_the_agent(server, agent, browser, tmp_path):
    page = _sign_in(browser, server)
    started = time.monotonic()
    shell = agent.gate("run_shell", {"command": "du -sh build logs"})
    print(f"\ngated call visible after {_appears(page, shell, started, _tail_limit()):.2f} s")
    mail = agent.gate("send_email", {"to": ["team@example.com"], "subject": "Release notes"})
    delete = agent.gate("delete_path", {"path": "build/", "recursive": True})
    expect(_card(page, delete)).to_be_visible()
    expect(page.locator("#pending-count")).to_have_text("3")
    expect(_card(page, shell).locator(".args")).to_contain_text('"command": "du -sh build logs"')

    _card(page, shell).get_by_role("button", name="Allow", exact=True).click()
    assert agent.answer(shell) == ("allow", "")
    expect(_card(page, shell)).to_have_count(0)

    card = _card(page, mail)
    card.get_by_role("button", name="Deny with reason…", exact=True).click()
    card.get_by_role("textbox").fill("Send it to the staging list, not the whole team.")
    card.get_by_role("button", name="Send denial").click()
    answer, message = agent.answer(mail)
    assert answer == "deny"
    assert message.endswith("Reason: Send it to the staging list, not the whole team.")

    _card(page, delete).get_by_role("button", name="Deny", exact=True).click()
    assert agent.answer(delete) == ("deny", "The user declined to run this tool call.")
    history = page.locator("#history-list .entry")
    expect(history).to_have_count(3)
    expect(history.first).to_contain_text("delete_path")
    expect(page.locator("#empty")).to_be_visible()

    _always_allow_and_revoke(page, agent)
    _keyboard(page, agent)
    _screenshot(page, agent, _screenshot_path(tmp_path))
    assert page.dialogs == [] and page.errors == []


def _always_allow_and_revoke(page, agent) -> None:
    status = agent.gate("run_shell", {"command": "git status"}, session_id="run-2")
    _card(page, status).get_by_role("button", name="Always allow", exact=True).click()
    assert agent.answer(status) == ("allow", "")
    rule = page.locator("#rules-list .rule")
    expect(rule).to_have_count(1)
    expect(rule).to_contain_text("run_shell")
    expect(rule).to_contain_text("in session run-2")
    time.sleep(1.2)  # other processes honour a new rule within RULES_CACHE_SECONDS (1 s)
    again = agent.gate("run_shell", {"command": "git diff"}, session_id="run-2")
    assert agent.answer(again, timeout=3) == ("allow", "")  # the rule answered, nobody asked
    elsewhere = agent.gate("run_shell", {"command": "git diff"}, session_id="run-3")
    expect(_card(page, elsewhere)).to_be_visible()  # another session still asks
    rule.get_by_role("button", name="Revoke the rule for run_shell").click()
    expect(rule).to_have_count(0)
    _card(page, elsewhere).get_by_role("button", name="Allow", exact=True).click()
    assert agent.answer(elsewhere) == ("allow", "")


def _keyboard(page, agent) -> None:
    first = agent.gate("write_file", {"path": "CHANGELOG.md", "content": "- tidy"})
    second = agent.gate("run_shell", {"command": "make test"})
    expect(_card(page, second)).to_be_visible()
    _card(page, first).focus()
    page.keyboard.press("a")
    assert agent.answer(first) == ("allow", "")
    expect(_card(page, second)).to_be_focused()  # focus moves on to the next call
    page.keyboard.press("d")
    assert agent.answer(second)[0] == "deny"


def _screenshot(page, agent, path: Path) -> None:
    tests = agent.gate("run_tests", {"path": "tests/"}, session_id="run-7")
    _card(page, tests).get_by_role("button", name="Always allow", exact=True).click()
    assert agent.answer(tests) == ("allow", "")
    expect(page.locator("#rules-list .rule")).to_have_count(1)
    agent.gate("run_shell", {"command": "pytest -q tests/", "cwd": "~/projects/acme"}, "run-7")
    last = agent.gate(
        "send_email",
        {
            "to": ["ops@example.com"],
            "subject": "Nightly clean-up finished",
            "body": "Removed 3 stale build folders (412 MB).\nNo errors.",
        },
        session_id="run-7",
    )
    expect(_card(page, last)).to_be_visible()
    expect(page.locator(".card")).to_have_count(2)  # decided cards have faded out
    page.evaluate("document.activeElement && document.activeElement.blur()")
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 10_000


XSS = '<script>window.__xss = 1</script><img src=x onerror="window.__xss = 2; alert(2)">'


def test_hostile_arguments_admin_decisions_and_a_server_restart(server, agent, browser):
    page = _sign_in(browser, server)
    hostile = agent.gate("write_file", {"path": "<img src=x onerror=alert(1)>.html", "body": XSS})
    card = _card(page, hostile)
    expect(card.locator(".args")).to_contain_text('"body": "<script>window.__xss = 1</script>')
    expect(card.locator(".args")).to_contain_text("<img src=x onerror=alert(1)>.html")
    assert card.locator("img, script").count() == 0
    assert page.evaluate("window.__xss === undefined")

    _deny_in_the_admin(page, server, hostile)
    assert agent.answer(hostile) == ("deny", "The user declined to run this tool call.")
    expect(card).to_have_count(0)
    expect(page.locator("#history-list .entry").first).to_contain_text("by you via admin")
    assert page.dialogs == [] and page.evaluate("window.__xss === undefined")

    _one_session_only(page, agent)
    _restart(page, server, agent)
    assert page.errors == []


def _deny_in_the_admin(page, server, approval_id: str) -> None:
    admin = page.context.new_page()
    admin.goto(f"{server.url}/admin/approvals/approval/?q={approval_id}")
    admin.locator("input.action-select").check()
    admin.locator("select[name=action]").select_option("deny_selected")
    admin.locator("button[name=index]").click()
    admin.get_by_role("button", name="Yes, I’m sure").click()
    expect(admin.locator(".messagelist")).to_contain_text("Decided 1")
    admin.close()
    # The inbox shows who decided it, and how, before the card fades out.
    expect(_card(page, approval_id).locator(".outcome")).to_contain_text("via admin")


def _one_session_only(page, agent) -> None:
    mine = agent.gate("run_shell", {"command": "ls"}, session_id="run-8")
    other = agent.gate("run_shell", {"command": "ls"}, session_id="run-9")
    expect(_card(page, other)).to_be_visible()
    narrow = page.context.new_page()
    narrow.goto(page.url.split("?")[0] + "?session_id=run-8")
    expect(_card(narrow, mine)).to_be_visible()
    expect(narrow.locator("#conn")).to_have_attribute("data-state", "live")
    assert _card(narrow, other).count() == 0
    narrow.close()
    _card(page, mine).get_by_role("button", name="Allow", exact=True).click()
    _card(page, other).get_by_role("button", name="Allow", exact=True).click()
    assert agent.answer(mine)[0] == agent.answer(other)[0] == "allow"


def _restart(page, server, agent) -> None:
    from approvals.gate import resolve_tool_decision

    kept = agent.gate("delete_path", {"path": "tmp/"})
    gone = agent.gate("run_shell", {"command": "whoami"})
    expect(_card(page, gone)).to_be_visible()
    server.kill()
    expect(page.locator("#conn")).to_have_attribute("data-state", "offline")
    new = agent.gate("send_email", {"to": ["a@example.com"]})  # gated while the site is down
    assert resolve_tool_decision(gone, "allow", via="api")  # decided while the page is away
    assert agent.answer(gone)[0] == "allow"

    # Back up, but the WebSocket is refused: the page lists and decides over HTTP.
    blocked = [True]
    page.route_web_socket(
        "**/ws/approvals/**", lambda ws: ws.close() if blocked[0] else ws.connect_to_server()
    )
    server.start()
    expect(_card(page, new)).to_be_visible(timeout=12000)
    expect(_card(page, gone)).to_have_count(0)
    assert page.locator("#conn").get_attribute("data-state") != "live"
    _card(page, new).get_by_role("button", name="Allow", exact=True).click()
    assert agent.answer(new) == ("allow", "")
    expect(page.locator("#history-list .entry").first).to_contain_text("by you via web")

    blocked[0] = False
    # An attempt in flight ends offline (it was refused) or live; offline: retry now.
    # (Polled from here: the page's CSP forbids the eval a string predicate needs.)
    deadline = time.monotonic() + 30
    while page.locator("#conn").get_attribute("data-state") != "live":
        assert time.monotonic() < deadline, "the page never went live again"
        retry = page.get_by_role("button", name="Reconnect now")
        if retry.is_visible():
            try:
                retry.click(timeout=1000)
            except sync_api.Error:  # hidden again: an attempt of its own started
                pass
        page.wait_for_timeout(100)
    expect(page.locator("#conn")).to_have_attribute("data-state", "live")
    expect(_card(page, kept)).to_be_visible()
    expect(page.locator("#pending-count")).to_have_text("1")


EDIT_SCREENSHOT = ROOT / "docs" / "inbox-edit.png"


def test_edit_then_allow_with_changes_runs_the_edit(server, agent, browser, tmp_path):
    page = _sign_in(browser, server)
    schema = {
        "type": "object",
        "properties": {"paths": {"type": "array", "items": {"type": "string"}}},
        "required": ["paths"],
        "additionalProperties": False,
    }
    aid = agent.agent.gate(
        "run-1",
        user_id=agent.user_id,
        tool_name="delete_paths",
        arguments={"paths": ["build", "logs"]},
        description="Free disk space before the release build \u202eexe.txt",
        editable=True,
        arguments_schema=schema,
    )
    card = _card(page, aid)
    expect(card).to_be_visible(timeout=15000)
    expect(card.locator(".description")).to_contain_text("Free disk space")
    expect(card.locator(".description")).to_contain_text("⟨U+202E⟩")
    card.get_by_role("button", name="Edit", exact=True).click()
    editor = card.locator(".edit-form textarea")
    editor.fill('{"paths": ["build"')
    expect(card.locator(".edit-error")).to_contain_text("Not valid JSON")
    editor.fill('{"paths": "build"}')
    expect(card.locator(".edit-error")).to_contain_text("$.paths")
    editor.fill('{\n  "paths": ["build"]\n}')
    expect(card.locator(".edit-error")).to_be_hidden()
    shot = EDIT_SCREENSHOT if os.environ.get("TOOLGATE_UPDATE_SCREENSHOT") else tmp_path / "e.png"
    card.screenshot(path=str(shot))
    card.get_by_role("button", name="Allow with changes", exact=True).click()
    line = agent.agent.answer(aid, 20)
    assert line["answer"] == "allow"
    assert line["arguments"] == {"paths": ["build"]}
    entry = page.locator(f'#history-list .entry[data-approval-id="{aid}"]')
    expect(entry.locator(".entry-args")).to_contain_text('"build"')
    expect(entry.locator(".entry-args")).not_to_contain_text("logs")
    assert page.errors == []


def test_allow_all_decides_every_shown_call_after_one_confirmation(server, agent, browser):
    page = _sign_in(browser, server, accept_dialogs=True)
    ids = [agent.gate("run_shell", {"command": f"echo {n}"}) for n in range(3)]
    for aid in ids:
        expect(_card(page, aid)).to_be_visible(timeout=15000)
    page.get_by_role("button", name="Allow all", exact=True).click()
    for aid in ids:
        assert agent.answer(aid) == ("allow", "")
    assert page.dialogs == ["Allow all 3 waiting tool calls?"]
    expect(page.locator("#bulk")).to_be_hidden()
