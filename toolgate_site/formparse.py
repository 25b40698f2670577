"""Daphne without Twisted's own parsing of form bodies.

Twisted's HTTP request, which daphne builds on, reads the ``Content-Type`` of
every POST with a body through the ``email`` package's header parser, and for
``application/x-www-form-urlencoded`` and ``multipart/form-data`` parses the
whole body into ``request.args``. Daphne never reads ``request.args``: it hands
the raw body to the ASGI application, and Django parses it again, within its
own limits (``DATA_UPLOAD_MAX_MEMORY_SIZE``, ``DATA_UPLOAD_MAX_NUMBER_FIELDS``).
The first parse is waste: about a quarter of a millisecond of the event loop's
time for every JSON POST (a decision included), and for a multipart upload a
second full parse, outside Django's limits, before Django sees it.

:func:`install` turns it off for daphne's requests (recent Twisted releases take the
switch as the request's ``parsePOSTFormSubmission``; with an older Twisted
nothing changes). ``toolgate_site.asgi`` calls it when daphne loads the application.
Nothing else changes: the body, the headers and the request Django gets are
the same bytes.
"""

from __future__ import annotations

import inspect

ATTRIBUTE = "_parsePOSTFormSubmission"


class _Off:
    """A data descriptor: reads as ``False``; Twisted's assignment in ``__init__`` is ignored."""

    def __get__(self, instance, owner=None) -> bool:
        return False

    def __set__(self, instance, value) -> None:
        pass


def install() -> bool:
    """Switch off Twisted's form parsing for daphne's HTTP requests; whether it was possible."""
    try:
        from daphne.http_protocol import WebRequest
        from twisted.web import http
    except ImportError:  # not served by daphne
        return False
    if "parsePOSTFormSubmission" not in inspect.signature(http.Request.__init__).parameters:
        return False  # a Twisted without the switch: it parses as before
    if not isinstance(WebRequest.__dict__.get(ATTRIBUTE), _Off):
        setattr(WebRequest, ATTRIBUTE, _Off())
    return True
