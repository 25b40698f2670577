"""The channel-layer link: what leaves together, in what order, and whose echo is dropped.

A link sends on a thread and event loop of its own. Messages handed over while
a send is under way leave together as one ``approvals.batch`` message; a lone
message leaves as it is. The fake layer below is shared by links on different
event loops (one per link, as in separate processes) and can hold a send
open, so what is batched does not depend on timing.
"""

from __future__ import annotations

import asyncio
import copy
import os
import threading
import time

import pytest

from approvals.channellink import BATCH_MAX, BATCH_TYPE, LayerLink
from tests.conftest import requires_redis


class SharedLayer:
    """A channel layer for links on different loops: ``group_send`` reaches every member."""

    def __init__(self) -> None:
        self.channels: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self.groups: dict[str, set[str]] = {}
        self.sent: list[dict] = []
        self.hold_first = threading.Event()  # set: sends go at once
        self.first_started = threading.Event()
        self._lock = threading.Lock()

    async def new_channel(self, prefix: str) -> str:
        with self._lock:
            name = f"{prefix}.{len(self.channels)}"
            self.channels[name] = (asyncio.get_running_loop(), asyncio.Queue())
        return name

    async def group_add(self, group: str, channel: str) -> None:
        with self._lock:
            self.groups.setdefault(group, set()).add(channel)

    async def group_send(self, group: str, message: dict) -> None:
        first = not self.first_started.is_set()
        self.first_started.set()
        if first:
            await asyncio.to_thread(self.hold_first.wait, 10)
        with self._lock:
            self.sent.append(copy.deepcopy(message))
            members = [self.channels[name] for name in self.groups.get(group, ())]
        for loop, queue in members:
            loop.call_soon_threadsafe(queue.put_nowait, copy.deepcopy(message))

    async def receive(self, channel: str) -> dict:
        return await self.channels[channel][1].get()


class Collector:
    def __init__(self) -> None:
        self.messages: list[dict] = []
        self._lock = threading.Lock()

    def __call__(self, message: dict) -> None:
        with self._lock:
            self.messages.append(message)

    def wait_for(self, count: int, timeout: float = 10.0) -> list[dict]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if len(self.messages) >= count:
                    return list(self.messages)
            time.sleep(0.005)
        with self._lock:
            return list(self.messages)


@pytest.fixture
def two_links():
    layer = SharedLayer()
    heard_by_sender, heard_by_other = Collector(), Collector()
    sender = LayerLink(layer, "approvals.events", heard_by_sender)
    other = LayerLink(layer, "approvals.events", heard_by_other)
    sender.start()
    other.start()
    assert sender.joined and other.joined
    try:
        yield layer, sender, other, heard_by_sender, heard_by_other
    finally:
        layer.hold_first.set()
        sender.stop()
        other.stop()


def event(n: int) -> dict:
    return {"type": "approvals.event", "origin": "p1", "event": {"n": n}}


def test_a_lone_message_leaves_as_it_is(two_links):
    layer, sender, other, heard_by_sender, heard_by_other = two_links
    layer.hold_first.set()
    sender.send(event(1))
    assert heard_by_other.wait_for(1) == [event(1)]
    assert layer.sent == [event(1)]  # no batch around it: what processes sent before batching
    # A lone message's echo reaches the sender's handler (the listener drops it by origin).
    assert heard_by_sender.wait_for(1) == [event(1)]
    assert sender.sent == 1 and other.received == 1


def test_messages_handed_over_during_a_send_leave_together_in_order(two_links):
    layer, sender, other, heard_by_sender, heard_by_other = two_links
    sender.send(event(0))
    assert layer.first_started.wait(5)  # the first send is under way and held open
    count = 2 * BATCH_MAX + 50
    for n in range(1, count + 1):
        sender.send(event(n))
    layer.hold_first.set()
    heard = heard_by_other.wait_for(count + 1)
    assert heard == [event(n) for n in range(count + 1)]  # all, once each, in order
    # One lone message, then the rest in batches of at most BATCH_MAX.
    assert layer.sent[0] == event(0)
    batches = layer.sent[1:]
    assert [m["type"] for m in batches] == [BATCH_TYPE] * 3
    assert [len(m["messages"]) for m in batches] == [BATCH_MAX, BATCH_MAX, 50]
    assert sender.sent == count + 1 and other.received == count + 1
    # The sender's own batches come back (pub/sub echoes) and are dropped undecoded;
    # only the lone message's echo reaches its handler.
    time.sleep(0.1)
    assert heard_by_sender.messages == [event(0)]


def test_a_batch_from_another_link_is_unpacked_and_junk_in_it_skipped(two_links):
    layer, sender, other, heard_by_sender, heard_by_other = two_links
    layer.hold_first.set()
    weird = {"type": BATCH_TYPE, "link": "someone-else", "messages": [event(1), "junk", event(2)]}
    not_a_list = {"type": BATCH_TYPE, "link": "someone-else", "messages": "junk"}
    loop = sender.loop
    for message in (weird, not_a_list, event(3)):
        asyncio.run_coroutine_threadsafe(
            layer.group_send("approvals.events", message), loop
        ).result(5)
    assert heard_by_other.wait_for(3) == [event(1), event(2), event(3)]
    assert heard_by_sender.wait_for(3) == [event(1), event(2), event(3)]


def test_a_message_sent_before_the_link_runs_is_dropped_not_kept():
    """The database carries what the link missed; nothing waits for a link that never ran."""
    link = LayerLink(SharedLayer(), "approvals.events", lambda m: None)
    link.send(event(1))
    assert link._pending == []


@requires_redis()
def test_a_burst_crosses_real_redis_in_few_publishes():
    from channels_redis.pubsub import RedisPubSubChannelLayer

    url = os.environ["TOOLGATE_TEST_REDIS_URL"]
    group = f"approvals.test-batch-{os.getpid()}"
    heard_by_sender, heard_by_other = Collector(), Collector()
    sender = LayerLink(RedisPubSubChannelLayer(hosts=[url]), group, heard_by_sender)
    other = LayerLink(RedisPubSubChannelLayer(hosts=[url]), group, heard_by_other)
    sender.start()
    other.start()
    try:
        assert sender.joined and other.joined
        time.sleep(0.2)  # both subscriptions are active
        count = 1000
        sends: list[dict] = []
        real_send = sender.layer.group_send

        async def counting_send(group_name, message):
            sends.append(message)
            await real_send(group_name, message)

        sender.layer.group_send = counting_send
        for n in range(count):
            sender.send(event(n))
        heard = heard_by_other.wait_for(count)
        assert heard == [event(n) for n in range(count)]
        assert len(sends) < count / 5  # a burst leaves in batches, not one publish per event
        time.sleep(0.2)
        lone = [m for m in sends if m.get("type") != BATCH_TYPE]
        assert heard_by_sender.messages == lone  # its own batches' echoes are dropped
    finally:
        sender.stop()
        other.stop()
