"""Who may see and decide which approvals: one permission, two questions.

A user sees and decides the approvals whose ``user`` is themselves; a user
with :data:`DECIDE_PERMISSION` sees and decides every approval. This module
imports nothing else of the app.
"""

from __future__ import annotations

from typing import Any

#: The permission's codename, as the migration creates it.
DECIDE_CODENAME = "decide_approval"
#: The permission as ``user.has_perm`` takes it.
DECIDE_PERMISSION = f"approvals.{DECIDE_CODENAME}"


def may_decide_any(user: Any) -> bool:
    """True when ``user`` may see and decide every approval, not only their own."""
    return bool(user is not None and user.has_perm(DECIDE_PERMISSION))


def may_see(user: Any, owner_id: Any) -> bool:
    """True when ``user`` may see and decide an approval that belongs to ``owner_id``.

    Their own call needs no permission lookup (the common case: two queries saved).
    """
    if owner_id is not None and str(owner_id) == str(user.pk):
        return True
    return may_decide_any(user)
