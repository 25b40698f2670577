"""An atomic block whose callbacks run once it has committed: wake after commit."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext

from django.db import connection, transaction

from ._compat import only_testcase_transactions


@contextmanager
def atomic_then(
    callbacks: list[Callable[[], None]], *, atomic: bool = True
) -> Iterator[list[Callable[[], None]]]:
    """An atomic block whose ``callbacks`` (append to the yielded list) run after commit.

    A rolled-back block runs none of them. Inside only a test case's wrapping
    transaction (which never commits) they run when this block ends, so
    waiters in such tests wake as in production. ``atomic=False`` is for a
    block of one statement, which commits by itself: no transaction is opened
    (inside a caller's, the callbacks still wait for its commit), and a block
    that raises runs none of them.
    """
    under_testcase = only_testcase_transactions(connection)
    with transaction.atomic() if atomic else nullcontext():
        yield callbacks
        if not under_testcase:
            for fn in callbacks:
                transaction.on_commit(fn, robust=True)
    if under_testcase:
        for fn in callbacks:
            fn()
