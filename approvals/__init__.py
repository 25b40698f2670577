"""toolgate: a person between an AI agent and its tools.

The agent-facing API lives in :mod:`approvals.gate`.
"""

__version__ = "0.1.0"
