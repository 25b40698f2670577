"""Process leases: a row per process that may hold waiting calls, kept alive by heartbeats.

The sweep marks a pending call ``abandoned`` when the lease its ``waiter``
names has not beaten for ``LEASE_TIMEOUT`` seconds.
"""

from __future__ import annotations

import os
import socket
import uuid

from django.utils import timezone

from .models import ProcessLease


def new_key() -> str:
    """A key naming this process uniquely (host, pid and a random part)."""
    return f"{socket.gethostname()[:30]}-{os.getpid()}-{uuid.uuid4().hex[:12]}"


class Lease:
    """This process's lease: written before its first waiter, then renewed."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.written = False

    def ensure(self) -> None:
        """Write the lease row unless this process already did."""
        if self.written:
            return
        ProcessLease.objects.update_or_create(
            key=self.key,
            defaults={
                "hostname": socket.gethostname()[:255],
                "pid": os.getpid(),
                "heartbeat_at": timezone.now(),
            },
        )
        self.written = True

    def beat(self) -> None:
        """Renew the lease; write it again if its row went missing."""
        if not self.written:
            return
        n = ProcessLease.objects.filter(key=self.key).update(heartbeat_at=timezone.now())
        if not n:
            self.written = False
            self.ensure()
