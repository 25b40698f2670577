"""The site's routes plus the benchmark's own views (see bench/_http_settings.py).

``/bench/ping`` answers ``{"ok": true}`` without touching the session, the user
or the database (bench/http_load.py's trivial request). The others add one part
of a decision at a time, for bench/request_parts.py: ``/bench/user`` reads the
session and the user; ``/bench/post`` reads and parses a JSON body, without a
session; ``/bench/signed-post`` is a JSON POST through the decision endpoint's
own decorator (signed in, CSRF checked, body bounded and parsed), deciding
nothing. ``/bench/releases`` reads nothing either, but releases the interpreter
lock 12 times around ~3 µs of C work each (a SHA-256 of 4 KiB), about what
three SQLite statements do (each ``sqlite3_step`` and ``sqlite3_reset`` runs
with the lock released): what those releases cost when the event loop's
thread is waiting to take the lock. ``/bench/gc`` answers what the garbage
collector has done in the serving process since it loaded these routes: the
collections of each generation, their CPU time and the longest one.
``/bench/threads`` names the serving process's Python threads by their kernel
thread ids, so that per-thread CPU read from ``/proc`` can be put to a name.
"""

import gc
import hashlib
import json
import threading
import time

from django.http import JsonResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

from approvals.jsonapi import json_endpoint, read_body
from toolgate_site.urls import urlpatterns as site_patterns


def ping(request):
    return JsonResponse({"ok": True})


def user(request):
    return JsonResponse({"ok": request.user.is_authenticated})


_BLOCK = b"x" * 4096
#: Releases per request: about what a decision's three statements make.
RELEASES = 12


def releases(request):
    for _ in range(RELEASES):
        hashlib.sha256(_BLOCK)  # over 2 KiB: hashed with the interpreter lock released
    return JsonResponse({"ok": True})


@csrf_exempt
def post(request):
    json.loads(request.body)
    return JsonResponse({"ok": True})


@json_endpoint("POST", csrf=True)
def signed_post(request):
    json.loads(read_body(request))
    return JsonResponse({"ok": True})


_collected = {"count": [0, 0, 0], "cpu": [0.0, 0.0, 0.0], "longest": 0.0}
_started = [0.0]


def _timed_collection(phase, info):
    if phase == "start":
        _started[0] = time.thread_time()
        return
    spent = time.thread_time() - _started[0]
    generation = info["generation"]
    _collected["count"][generation] += 1
    _collected["cpu"][generation] += spent
    _collected["longest"] = max(_collected["longest"], spent)


gc.callbacks.append(_timed_collection)


def collections(request):
    return JsonResponse(_collected)


def thread_names(request):
    return JsonResponse({str(t.native_id): t.name for t in threading.enumerate()})


urlpatterns = [
    path("bench/gc", collections),
    path("bench/threads", thread_names),
    path("bench/ping", ping),
    path("bench/user", user),
    path("bench/releases", releases),
    path("bench/post", post),
    path("bench/signed-post", signed_post),
    *site_patterns,
]
