"""ASGI entry point: HTTP through Django, WebSockets through Channels.

``daphne toolgate_site.asgi:application`` serves both.
"""

import os

import django
from django.core.handlers.asgi import ASGIHandler

from toolgate_site import collector, formparse
from toolgate_site.onehop import OneHopASGIHandler
from toolgate_site.threads import PooledThreads

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "toolgate_site.settings")
# Set up Django (and the app registry) before anything imports models.
django.setup(set_prefix=False)
# A synchronous view's request in one thread hand-off (see onehop);
# DJANGO_ASGI_ONE_HOP=0 serves it with Django's own handler.
if os.environ.get("DJANGO_ASGI_ONE_HOP", "1") == "0":
    django_asgi_app = ASGIHandler()
else:
    django_asgi_app = OneHopASGIHandler()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.urls import path  # noqa: E402

from approvals.agentapi.asgi import AgentWaitApp  # noqa: E402
from approvals.listener import get_listener  # noqa: E402
from approvals.routing import websocket_urlpatterns  # noqa: E402
from approvals.security import OriginValidator  # noqa: E402

# A serving process runs its listener from the start, not on first use: its outbox
# worker sends the notifications other processes wrote (after a restart, too).
get_listener()
# Django parses request bodies; Twisted need not parse them first (see formparse).
formparse.install()

application = ProtocolTypeRouter(
    {
        # Long-polls of the agent API without a thread each; the rest is Django's,
        # on a few long-lived request threads.
        "http": AgentWaitApp(PooledThreads.wrap(django_asgi_app)),
        "websocket": OriginValidator(
            AuthMiddlewareStack(URLRouter([path("ws/", URLRouter(websocket_urlpatterns))]))
        ),
    }
)

# Load the URL patterns and their views now, then keep the collector from
# scanning all that startup built on every full collection (see collector).
from django.urls import get_resolver  # noqa: E402

get_resolver().url_patterns  # noqa: B018
collector.settle()
