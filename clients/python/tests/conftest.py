from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest
from standin import StandinServer
from toolgate_client import ToolgateClient


@pytest.fixture(autouse=True)
def _no_django() -> Iterator[None]:
    yield
    assert "django" not in sys.modules, "the client or its tests imported Django"


@pytest.fixture
def standin() -> Iterator[StandinServer]:
    server = StandinServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def client(standin: StandinServer) -> Iterator[ToolgateClient]:
    # Short waits and backoff keep the tests quick; the logic is the same at 30 s.
    with ToolgateClient(
        standin.url, "key-alice", wait=1, initial_backoff=0.05, max_backoff=0.2, retry_for=20
    ) as tg:
        yield tg
