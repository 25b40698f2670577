"""The admin: approvals (a read-only audit trail with bulk decisions), rules, process leases,
agent keys (created once, revoked, never shown again).

Importing this package registers every model admin with the default site.
"""

from .agentkey import AgentKeyAdmin
from .approval import ApprovalAdmin
from .lease import ProcessLeaseAdmin
from .rule import RuleAdmin
from .webhook import DeliveryAdmin, WebhookAdmin

__all__ = [
    "AgentKeyAdmin",
    "ApprovalAdmin",
    "DeliveryAdmin",
    "ProcessLeaseAdmin",
    "RuleAdmin",
    "WebhookAdmin",
]
