from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest
from realserver import ToolgateServer
from toolgate_client import ToolgateClient


@pytest.fixture(autouse=True)
def _no_django() -> Iterator[None]:
    yield
    assert "django" not in sys.modules, "the client or its tests imported Django"


@pytest.fixture(scope="session")
def _site() -> Iterator[ToolgateServer]:
    """One real daphne (and database) for the run; every test starts it clean."""
    site = ToolgateServer()
    try:
        site.setup()
        yield site
    finally:
        site.close()


@pytest.fixture
def server(_site: ToolgateServer) -> ToolgateServer:
    _site.reset()
    return _site


@pytest.fixture
def client(server: ToolgateServer) -> Iterator[ToolgateClient]:
    # Short waits and backoff keep the tests quick; the logic is the same at 30 s.
    with ToolgateClient(
        server.url,
        server.keys["alice"],
        wait=1,
        initial_backoff=0.05,
        max_backoff=0.2,
        retry_for=30,
    ) as tg:
        yield tg
