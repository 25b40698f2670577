"""The host's own ASGI router, with the approvals consumer nested under ``realtime/gate/``.

The host already has WebSocket routes of its own (``realtime/echo/``); the
app's patterns are one more entry in that router.
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hostsite.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.generic.websocket import JsonWebsocketConsumer  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.urls import path  # noqa: E402

import approvals.routing  # noqa: E402


class EchoConsumer(JsonWebsocketConsumer):
    """A route the host had before it added toolgate."""

    def receive_json(self, content, **kwargs):
        self.send_json({"echo": content})


application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": AllowedHostsOriginValidator(
            AuthMiddlewareStack(
                URLRouter(
                    [
                        path(
                            "realtime/",
                            URLRouter(
                                [
                                    path("echo/", EchoConsumer.as_asgi()),
                                    path(
                                        "gate/",
                                        URLRouter(approvals.routing.websocket_urlpatterns),
                                    ),
                                ]
                            ),
                        ),
                    ]
                )
            )
        ),
    }
)
