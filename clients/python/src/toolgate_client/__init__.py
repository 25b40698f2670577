"""Ask a person before an agent runs a tool: the client for toolgate's agent API.

Needs no Django: it speaks HTTP to a toolgate server with an agent key.
"""

from __future__ import annotations

__version__ = "0.1.0"

from .client import ToolgateClient  # noqa: E402
from .errors import ApprovalIdInUse, AuthenticationError, ToolgateError  # noqa: E402
from .protocol import Decision, new_approval_id  # noqa: E402

__all__ = [
    "ApprovalIdInUse",
    "AuthenticationError",
    "Decision",
    "ToolgateClient",
    "ToolgateError",
    "__version__",
    "new_approval_id",
]
