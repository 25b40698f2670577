"""WebSocket routes. Include under any prefix, also inside a nested ``URLRouter``:

``URLRouter([path("ws/", URLRouter(approvals.routing.websocket_urlpatterns))])``
serves the live inbox at ``/ws/approvals/``.
"""

from django.urls import path

from .consumers import ApprovalsConsumer

websocket_urlpatterns = [
    path("approvals/", ApprovalsConsumer.as_asgi(), name="approvals-ws"),
]
