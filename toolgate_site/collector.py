"""The serving process's garbage collector: what startup built is not scanned again.

Python's cyclic collector looks at every container object in the process when
it runs a full collection, and a daphne process serving the site holds a few
hundred thousand of them from startup alone (Django, the app registry, the URL
patterns, Twisted) that stay alive as long as the process. The objects of
requests in flight when a young collection runs are promoted towards the old
generation, so under load full collections came often: in one run of
``bench/request_parts.py`` (six kinds of request, three rounds) the process
ran 37 of them, ~80 ms of CPU each (the longest 104 ms, a pause for whatever
the process was serving then), and collections cost ~0.18 ms of every
request on average.

:func:`settle`, called once the application is built, collects what startup
left behind and moves everything alive into the permanent generation
(``gc.freeze()``), which collections skip: a full collection then scans only
what requests made. It also raises the young generation's threshold from
Python's 700 allocations to ``DJANGO_ASGI_GC_THRESHOLD`` (default 7,000), so
fewer objects of requests in flight are promoted and full collections come
rarely: 4 in the same benchmark (one of them the collection at startup), and
0.05–0.08 ms of collection per request. At most that many more objects wait
to be collected, a few MiB.

``DJANGO_ASGI_GC_FREEZE=0`` leaves what startup built to the collector;
``DJANGO_ASGI_GC_THRESHOLD=0`` leaves Python's thresholds. Objects freed by
their reference count go at once, as always; only objects in reference cycles
wait for a collection, which now comes after ten times as many allocations.
"""

from __future__ import annotations

import gc
import os

from django.core.exceptions import ImproperlyConfigured

#: The young generation's threshold by default (Python's is 700).
THRESHOLD = 7000


def settle(environ: os._Environ | dict | None = None) -> dict:
    """Freeze what startup built and set the young generation's threshold, as
    ``DJANGO_ASGI_GC_FREEZE`` and ``DJANGO_ASGI_GC_THRESHOLD`` say; what it did."""
    env = os.environ if environ is None else environ
    freeze = _flag(env, "DJANGO_ASGI_GC_FREEZE")
    threshold = _count(env, "DJANGO_ASGI_GC_THRESHOLD", THRESHOLD)
    young, middle, old = gc.get_threshold()
    done = {"frozen": 0, "threshold": threshold or young}
    if threshold:
        gc.set_threshold(threshold, middle, old)
    if freeze:
        gc.collect()  # what startup left behind is freed, not frozen
        gc.freeze()
        done["frozen"] = gc.get_freeze_count()
    return done


def _flag(env, name: str) -> bool:
    raw = (env.get(name) or "1").strip()
    if raw not in ("0", "1"):
        raise ImproperlyConfigured(f"{name} must be 0 or 1, not {raw!r}.")
    return raw == "1"


def _count(env, name: str, default: int) -> int:
    raw = (env.get(name) or "").strip()
    if not raw:
        return default
    if not raw.isdigit():
        raise ImproperlyConfigured(f"{name} must be a whole number of allocations, not {raw!r}.")
    return int(raw)
