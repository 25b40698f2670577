"""Signals: the documented extension points.

Both are sent only after the database transaction that wrote the change has
committed, from the thread that made the change.
"""

from django.dispatch import Signal

#: Sent when a tool call is gated and its ``Approval`` row is written.
#:
#: Arguments: ``sender`` (the ``Approval`` class), ``approval`` (the saved
#: ``Approval``; already decided when a rule answered it).
approval_requested = Signal()

#: Sent once per approval, by the caller whose decision won.
#:
#: Arguments: ``sender`` (the ``Approval`` class), ``approval`` (the ``Approval``
#: as decided), ``status`` (its final status), ``decided_via`` (``web``,
#: ``websocket``, ``admin``, ``api``, ``rule``, ``timeout``, ``cancel`` or
#: ``sweep``), ``decided_by`` (a user or ``None``).
approval_decided = Signal()
