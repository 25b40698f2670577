"""The site's settings with one extra route for bench/http_load.py: a trivial JSON view.

It answers ``{"ok": true}`` through the same ASGI server and middleware as the
decision endpoint, without touching the session, the user or the database, so
decisions/s can be compared with what the same server does for nearly nothing.
"""

import os

from toolgate_site.settings import *  # noqa: F403

ROOT_URLCONF = "bench._http_urls"

if os.environ.get("TOOLGATE_BENCH_DJANGO_AUTH"):
    # The baseline run: sessions and users read through Django's own engine and
    # backend, as before approvals.sessions and approvals.backends.
    SESSION_ENGINE = "django.contrib.sessions.backends.db"
    AUTHENTICATION_BACKENDS = ["django.contrib.auth.backends.ModelBackend"]
