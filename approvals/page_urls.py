"""The inbox page and the page for one call (`<approval_id>/`).

Include under any prefix: ``path("approvals/", include("approvals.page_urls"))``.

It lives in its own namespace (``approvals_page``) so it can sit beside
``approvals.urls`` (namespace ``approvals``) without a clash; the page finds
the JSON endpoints by their ``approvals:`` names.
"""

from django.urls import path

from .pages import inbox
from .review import review

app_name = "approvals_page"
urlpatterns = [
    path("", inbox, name="inbox"),
    path("<str:approval_id>/", review, name="review"),
]
