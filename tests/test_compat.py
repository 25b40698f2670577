"""Each private name ``approvals._compat`` leans on, checked against the installed versions.

If Python, Django or Channels change one of these, this file fails and says
which; nothing else in the app touches a private name.
"""

from __future__ import annotations

import threading

import pytest
from channels.auth import AuthMiddlewareStack
from channels.routing import ProtocolTypeRouter, URLRouter
from channels.security.websocket import AllowedHostsOriginValidator
from django.db import connection, transaction
from django.urls import path, re_path

from approvals import _compat
from approvals.consumers import ApprovalsConsumer


def test_threading_event_still_notifies_through_its_private_condition():
    event = threading.Event()
    assert isinstance(event._cond, type(threading.Condition())), "Event._cond changed"
    calls = []
    remove = _compat.hook_event_set(event, lambda: calls.append(1))
    setter = event.set  # a bound method taken before the hook reaches it too
    setter()
    assert calls == [1] and event.is_set()
    event.clear()
    remove()
    event.set()
    assert calls == [1]


def test_event_wait_still_works_through_the_wrapped_condition():
    event = threading.Event()
    _compat.hook_event_set(event, lambda: None)
    threading.Timer(0.05, event.set).start()
    assert event.wait(5)


@pytest.mark.django_db
def test_django_still_marks_test_case_transactions():
    # pytest-django wraps this test in a TestCase-style atomic block.
    assert connection.atomic_blocks, "Connection.atomic_blocks changed"
    assert _compat.only_testcase_transactions(connection) is True
    with transaction.atomic():
        assert _compat.only_testcase_transactions(connection) is False


@pytest.mark.django_db(transaction=True)
def test_outside_a_test_case_nothing_is_a_test_case_transaction():
    assert _compat.only_testcase_transactions(connection) is False
    with transaction.atomic():
        assert _compat.only_testcase_transactions(connection) is False


def _is_ours(consumer: type) -> bool:
    return issubclass(consumer, ApprovalsConsumer)


def test_channels_router_tree_is_still_walkable():
    inner = URLRouter([path("approvals/", ApprovalsConsumer.as_asgi())])
    app = ProtocolTypeRouter(
        {
            "websocket": AllowedHostsOriginValidator(
                AuthMiddlewareStack(URLRouter([path("live/ws/", inner)]))
            )
        }
    )
    assert _compat.route_to_consumer(app, _is_ours) == "live/ws/approvals/"


def test_a_regex_route_names_no_single_path():
    app = URLRouter([re_path(r"^ws/(?P<x>\w+)/$", ApprovalsConsumer.as_asgi())])
    assert _compat.route_to_consumer(app, _is_ours) is None


class _Protocol:
    """Stands for daphne's WebSocket protocol: what the probe reads is its ``transport``."""

    transport = None


def _daphne_send(protocol):
    """The ``send`` daphne gives an application serving ``protocol`` (its own code path)."""
    import asyncio

    from daphne.server import Server

    given = {}

    async def application(scope, receive, send):
        given["send"] = send

    async def build():
        server = Server(application, endpoints=["tcp:port=0"], signal_handlers=False)
        server.connections = {protocol: {}}
        server.create_application(protocol, {"type": "websocket"})
        await asyncio.sleep(0)  # the application instance runs and hands its send over
        server.connections[protocol]["application_instance"].cancel()

    asyncio.run(build())
    return given["send"]


def test_daphne_send_still_reaches_the_twisted_transport_buffers():
    """The unsent-bytes probe reads daphne's ``partial(handle_reply, protocol)`` and the
    Twisted transport's ``dataBuffer``/``offset``/``_tempDataLen``: a change to any of
    them would leave never-reading sockets unbounded again, so it fails here."""
    from twisted.internet.abstract import FileDescriptor
    from twisted.internet.testing import MemoryReactor

    transport = FileDescriptor(MemoryReactor())
    transport.connected = True
    for name in ("dataBuffer", "offset", "_tempDataLen", "_tempDataBuffer"):
        assert hasattr(transport, name), f"twisted FileDescriptor.{name} changed"
    protocol = _Protocol()
    protocol.transport = transport
    probe = _compat.unsent_bytes_probe(_daphne_send(protocol))
    assert probe is not None, "daphne's send no longer carries its protocol"
    assert probe() == 0
    transport.write(b"x" * 1000)  # queued, not yet written (no reactor runs)
    assert probe() == 1000
    transport.dataBuffer, transport.offset = b"y" * 500, 100  # a half-written buffer
    assert probe() == 1400


def test_the_probe_looks_through_channels_session_middleware():
    """The consumer's ``send`` is Channels' ``InstanceSessionWrapper.send``, which keeps
    daphne's as ``real_send``."""
    from channels.sessions import InstanceSessionWrapper
    from twisted.internet.abstract import FileDescriptor
    from twisted.internet.testing import MemoryReactor

    protocol = _Protocol()
    protocol.transport = FileDescriptor(MemoryReactor())
    wrapper = InstanceSessionWrapper({"type": "websocket", "cookies": {}}, _daphne_send(protocol))
    assert wrapper.real_send is not None, "InstanceSessionWrapper.real_send changed"
    assert _compat.unsent_bytes_probe(wrapper.send) is not None


def test_the_probe_is_none_under_another_server():
    async def send(message):
        return None

    assert _compat.unsent_bytes_probe(send) is None
