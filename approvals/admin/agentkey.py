"""Agent keys: create one (shown once), see which are used, revoke them.

Adding a key takes a name and the user the agent acts for; on save the key is
generated (:func:`approvals.agentkeys.create_key`) and shown once in a message.
Only its hash is stored, and the hash is never shown. A key is never edited or
deleted here: revoking it (the ``revoke_selected`` action) stops it at once and
keeps the calls it gated pointing at it in the audit trail.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from .. import agentkeys
from ..models import AgentKey

SHOWN = ("name", "prefix", "user", "created_at", "last_used_at", "revoked_at")


@admin.register(AgentKey)
class AgentKeyAdmin(admin.ModelAdmin):
    """Name + user to add; everything else read-only; revoke instead of delete."""

    list_display = SHOWN
    list_filter = (("revoked_at", admin.EmptyFieldListFilter), "created_at")
    list_select_related = ("user",)
    search_fields = ("name", "prefix", "user__username")
    ordering = ("-created_at", "-pk")
    actions = ["revoke_selected"]

    def get_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        return ("name", "user") if obj is None else SHOWN

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        return () if obj is None else SHOWN

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: AgentKey, form: Any, change: bool) -> None:
        if change:
            return  # nothing of a key changes here but its revocation (the action)
        try:
            key, raw = agentkeys.create_key(obj.user, obj.name)
        except ValueError as exc:  # the name was taken between the form check and now
            self.message_user(request, str(exc), messages.ERROR)
            raise
        obj.pk, obj.prefix, obj.created_at = key.pk, key.prefix, key.created_at
        obj.key_hash = key.key_hash
        self.message_user(
            request,
            _(
                "The new agent key for %(user)s is shown only now; store it safely "
                "(e.g. as TOOLGATE_KEY): %(key)s"
            )
            % {"user": obj.user.get_username(), "key": raw},
            messages.WARNING,
        )

    @admin.action(description=_("Revoke the selected agent keys"), permissions=["change"])
    def revoke_selected(self, request: HttpRequest, queryset: QuerySet[AgentKey]) -> None:
        count = queryset.filter(revoked_at__isnull=True).update(revoked_at=timezone.now())
        self.message_user(
            request,
            ngettext("Revoked %(count)d agent key.", "Revoked %(count)d agent keys.", count)
            % {"count": count},
            messages.SUCCESS,
        )
