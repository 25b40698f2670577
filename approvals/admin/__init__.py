"""The admin: approvals (a read-only audit trail with bulk decisions), rules, process leases.

Importing this package registers every model admin with the default site.
"""

from .approval import ApprovalAdmin
from .lease import ProcessLeaseAdmin
from .rule import RuleAdmin
from .webhook import DeliveryAdmin, WebhookAdmin

__all__ = ["ApprovalAdmin", "DeliveryAdmin", "ProcessLeaseAdmin", "RuleAdmin", "WebhookAdmin"]
