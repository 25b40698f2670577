"""The inbox with arguments cut short and a snapshot that left calls out, in Chromium.

A call whose arguments are over ``PREVIEW_BYTES`` shows the start of them and a
button that loads the rest; a snapshot capped by ``SNAPSHOT_MAX_BYTES`` says
how many calls it did not show.
"""

from __future__ import annotations

import pytest

from approvals import gate
from approvals.listener import get_listener
from tests import procs

from .test_browser import CHROMIUM, Site, _card, _sign_in, expect
from .test_browser import browser as browser  # noqa: F401  (the fixtures)
from .test_browser import pytestmark as browser_marks
from .test_browser import user as user  # noqa: F401

pytestmark = browser_marks
LIMITS = {"PREVIEW_BYTES": 200, "SNAPSHOT_MAX_BYTES": 2000}
assert CHROMIUM


class LimitedSite(Site):
    def __init__(self, env: dict) -> None:
        self.env = env
        self.server = procs.start_daphne(env, approvals=LIMITS)
        self.url = self.server.url


@pytest.fixture
def small_frames(child_env, user):  # noqa: F811
    site = LimitedSite(child_env)
    yield site
    site.stop()


def test_cut_arguments_load_whole_and_left_out_calls_are_counted(small_frames, user, browser):  # noqa: F811
    page = _sign_in(browser, small_frames)  # the server's listener runs from here on
    listener = get_listener()
    ids = []
    for n in range(6):
        aid = gate.new_approval_id()
        arguments = {"text": f"{n}-" + "a" * 600 + "-end"}
        listener.unregister(gate.begin_tool_decision("run-1", aid, user=user, arguments=arguments))
        ids.append(aid)
    expect(_card(page, ids[-1])).to_be_visible()  # live, as tool_start
    page.reload()  # a fresh snapshot, capped
    expect(page.locator("#conn")).to_have_attribute("data-state", "live")
    card = _card(page, ids[0])
    expect(card).to_be_visible()
    shown = page.locator(".card").count()
    assert 0 < shown < 6, (
        shown,
        card.locator(".args").inner_text()[:300],
        page.locator("#more-pending").count(),
    )
    expect(page.locator("#more-pending")).to_have_text(f"{6 - shown} more calls not shown")
    args = card.locator(".args")
    expect(args).not_to_contain_text("-end")
    card.get_by_role("button", name="Show all arguments").click()
    expect(args).to_contain_text("-end")
    expect(card.get_by_role("button", name="Show all arguments")).to_have_count(0)
    assert page.errors == []
