"""The processes that may hold waiting calls, and when each last beat (read-only)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from ..models import ProcessLease


@admin.register(ProcessLease)
class ProcessLeaseAdmin(admin.ModelAdmin):
    """The processes that may hold waiting calls, and when each last beat."""

    list_display = ("key", "hostname", "pid", "started_at", "heartbeat_at")
    ordering = ("-heartbeat_at",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
