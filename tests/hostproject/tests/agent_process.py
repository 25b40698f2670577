"""An agent in its own process, as a host would run one: gate one call, print the answer.

Usage: python agent_process.py <sqlite-file> <user-email> <session-id>
"""

import os
import sys

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hostsite.settings")

import django  # noqa: E402
from django.conf import settings  # noqa: E402

settings.DATABASES["default"]["NAME"] = sys.argv[1]  # the test database of the parent
django.setup()

from django.contrib.auth import get_user_model  # noqa: E402

from approvals import gate  # noqa: E402

user = get_user_model().objects.get(email=sys.argv[2])
approval_id = gate.new_approval_id()
slot = gate.begin_tool_decision(
    sys.argv[3], approval_id, tool_name="deploy", arguments={"env": "prod"}, user=user, timeout=60
)
print(f"gated {approval_id}", flush=True)
print(f"answer {gate.wait_tool_decision(slot, approval_id)}", flush=True)
