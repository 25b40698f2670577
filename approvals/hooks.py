"""Hooks run inside the transaction that gates or decides a call.

The decision path (:mod:`approvals.gating`, :mod:`approvals.decisions`) calls
:func:`gated` and :func:`decided` inside its atomic block, so whatever a hook
writes (the notification outbox, say) commits or rolls back with the change it
reports. Parts above register from ``AppConfig.ready()``; this module imports
nothing of the app, so the decision path never learns who listens.

A hook must be quick and must not swallow database errors: an exception rolls
the change back, as any failure inside the transaction would.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

GatedHook = Callable[[Any], None]
DecidedHook = Callable[[Any, str], None]

_gated: dict[str, GatedHook] = {}
_decided: dict[str, DecidedHook] = {}
_decided_writes: dict[str, Callable[[], bool] | None] = {}


def on_gated(name: str, fn: GatedHook) -> None:
    """Call ``fn(approval)`` inside the transaction that writes a gated call's row.

    The row may be decided already (a rule answered). Registering a name again
    replaces its hook.
    """
    _gated[name] = fn


def on_decided(name: str, fn: DecidedHook, *, writes: Callable[[], bool] | None = None) -> None:
    """Call ``fn(pk, status)`` inside the transaction whose update decided a call.

    Only the winning decision calls it. Registering a name again replaces it.
    ``writes``, when given, says beforehand whether ``fn`` would write anything
    now: while no hook would, a decision is its one conditional update, with no
    transaction around it (two round trips fewer on a database server), and
    the hooks are not called for it.
    """
    _decided[name] = fn
    _decided_writes[name] = writes


def decided_writes() -> bool:
    """Whether a decided hook would write now (a hook registered without ``writes``: yes)."""
    return any(writes is None or writes() for writes in list(_decided_writes.values()))


def gated(approval: Any) -> None:
    """Run the gated hooks (the decision path calls this inside its transaction)."""
    for fn in list(_gated.values()):
        fn(approval)


def decided(pk: Any, status: str) -> None:
    """Run the decided hooks (the decision path calls this inside its transaction)."""
    for fn in list(_decided.values()):
        fn(pk, status)
