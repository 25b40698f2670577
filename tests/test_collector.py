"""The serving process's garbage collector settings (toolgate_site.collector)."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import weakref
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from toolgate_site import collector

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def restored():
    """Put the collector back as this test process had it."""
    threshold = gc.get_threshold()
    frozen = gc.get_freeze_count()
    yield
    gc.set_threshold(*threshold)
    if not frozen:
        gc.unfreeze()


class _Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the collector frees it


def _tracked(obj) -> bool:
    return any(o is obj for o in gc.get_objects())


def test_what_startup_built_is_frozen_and_what_comes_later_is_not(restored):
    before = _Node()
    done = collector.settle({})
    after = _Node()
    # (frozen objects freed since by their reference count leave the count: compare loosely)
    assert done["frozen"] > 0 and gc.get_freeze_count() > 0
    assert done["threshold"] == gc.get_threshold()[0] == collector.THRESHOLD
    # A collection no longer looks at what was alive at startup…
    assert not _tracked(before)
    assert _tracked(after)
    # …and still frees the cycles made later.
    ref = weakref.ref(after)
    del after
    gc.collect()
    assert ref() is None


def test_both_can_be_turned_off(restored):
    threshold = gc.get_threshold()
    before = _Node()
    done = collector.settle({"DJANGO_ASGI_GC_FREEZE": "0", "DJANGO_ASGI_GC_THRESHOLD": "0"})
    assert gc.get_threshold() == threshold
    assert _tracked(before)  # not frozen: collections still look at it
    assert done == {"frozen": 0, "threshold": threshold[0]}


def test_the_threshold_is_set_as_given_and_the_older_generations_kept(restored):
    _, middle, old = gc.get_threshold()
    collector.settle({"DJANGO_ASGI_GC_FREEZE": "0", "DJANGO_ASGI_GC_THRESHOLD": "2500"})
    assert gc.get_threshold() == (2500, middle, old)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("DJANGO_ASGI_GC_FREEZE", "yes"),
        ("DJANGO_ASGI_GC_THRESHOLD", "-5"),
        ("DJANGO_ASGI_GC_THRESHOLD", "lots"),
    ],
)
def test_a_bad_value_is_refused_with_its_name(restored, name, value):
    threshold = gc.get_threshold()
    with pytest.raises(ImproperlyConfigured, match=name):
        collector.settle({name: value})
    assert gc.get_threshold() == threshold  # nothing half-done


PROBE = (
    "import gc\n"
    "import toolgate_site.asgi\n"
    "print('SETTLED', gc.get_freeze_count() > 10000, gc.get_threshold()[0])\n"
)


@pytest.mark.parametrize(
    ("env", "expected"),
    [({}, "SETTLED True 7000"), ({"DJANGO_ASGI_GC_FREEZE": "0"}, "SETTLED False 7000")],
)
def test_the_served_application_settles_the_collector(tmp_path, env, expected):
    """What daphne imports (toolgate_site.asgi) has frozen what startup built."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "TOOLGATE_"))}
    clean.pop("REDIS_URL", None)
    out = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=ROOT,
        env={
            **clean,
            "PYTHONPATH": str(ROOT),
            "DATABASE_URL": f"sqlite:///{tmp_path / 'probe.sqlite3'}",
            "TOOLGATE_QUIET": "1",
            **env,
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert expected in out.stdout
