"""ASGI entry point: HTTP through Django, WebSockets through Channels.

``daphne toolgate_site.asgi:application`` serves both.
"""

import os

from django.core.asgi import get_asgi_application

from toolgate_site.threads import PooledThreads

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "toolgate_site.settings")
# Set up Django (and the app registry) before anything imports models.
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.urls import path  # noqa: E402

from approvals.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": PooledThreads.wrap(django_asgi_app),
        "websocket": AllowedHostsOriginValidator(
            AuthMiddlewareStack(URLRouter([path("ws/", URLRouter(websocket_urlpatterns))]))
        ),
    }
)
