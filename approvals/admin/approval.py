"""The approvals admin: a read-only audit trail, with bulk allow/deny for deciders.

Nobody (superusers included) may add, change or delete an ``Approval`` here:
the rows are an audit log. Users with ``approvals.decide_approval`` get the
``allow_selected`` and ``deny_selected`` actions, which decide through
:func:`approvals.decisions.decide` like every other entry point.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.template.response import TemplateResponse
from django.utils.html import format_html
from django.utils.translation import gettext_lazy as _

from .. import listener
from ..conf import setting
from ..decisions import decide
from ..models import Approval, Status, Via, status_for_answer
from ..permissions import may_decide_any
from .dates import date_hierarchy
from .export import csv_response
from .filters import AwaitingFilter, RecentValuesFieldListFilter, format_duration

#: The most pending calls one confirmation page carries (oldest first).
MAX_BATCH = 1000
#: How many of them the confirmation page lists by name.
MAX_LISTED = 100


class DecideForm(forms.Form):
    skipped = forms.IntegerField(required=False, min_value=0, widget=forms.HiddenInput)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["reason"] = forms.CharField(
            label=_("Reason (optional)"),
            required=False,
            max_length=setting("MAX_REASON_LENGTH"),
            widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
            help_text=_("Stored with each decision; on deny it is fed back to the agent's model."),
        )


@admin.register(Approval)
class ApprovalAdmin(admin.ModelAdmin):
    list_display = (
        "created_at",
        "user",
        "agent_key",
        "session",
        "tool_name",
        "status",
        "decided_via",
        "decided_by",
        "time_to_decision_display",
    )
    list_filter = (
        AwaitingFilter,
        "status",
        "decided_via",
        ("tool_name", RecentValuesFieldListFilter),
        ("created_at", admin.DateFieldListFilter),
    )
    search_fields = ("approval_id", "session_id", "tool_name")
    search_help_text = _(
        "An exact approval id or session id finds it at once; anything else searches "
        "ids, sessions and tool names for the text."
    )
    date_hierarchy = "created_at"
    list_select_related = ("user", "decided_by", "agent_key")
    show_full_result_count = False
    sortable_by = ("created_at",)
    ordering = ("-created_at",)
    actions = ("allow_selected", "deny_selected", "export_csv")
    readonly_fields = ("arguments_pretty", "edited_arguments_pretty", "time_to_decision_display")
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "approval_id",
                    "tool_name",
                    "tool_call_id",
                    "description",
                    "arguments_pretty",
                    "editable",
                    "edited_arguments_pretty",
                )
            },
        ),
        (_("Whose"), {"fields": ("user", "session_id", "agent_key")}),
        (_("Outcome"), {"fields": ("status", "decided_via", "decided_by", "reason")}),
        (_("Run"), {"fields": ("executed_at", "execution_ok", "execution_summary")}),
        (
            _("When"),
            {"fields": ("created_at", "expires_at", "decided_at", "time_to_decision_display")},
        ),
        (_("Process"), {"fields": ("waiter",), "classes": ("collapse",)}),
    )

    # -- read-only, for everyone --------------------------------------------

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return super().has_view_permission(request, obj) or self.has_decide_permission(request)

    def has_decide_permission(self, request: HttpRequest) -> bool:
        """May this user allow or deny calls (``approvals.decide_approval``)?"""
        return may_decide_any(request.user)

    # -- columns -------------------------------------------------------------

    @admin.display(description=_("session"))
    def session(self, obj: Approval) -> str:
        if not obj.session_id:
            return "—"
        query = urlencode({"session_id": obj.session_id})
        return format_html('<a href="?{}">{}</a>', query, obj.session_id)

    @admin.display(description=_("time to decision"))
    def time_to_decision_display(self, obj: Approval) -> str:
        return format_duration(obj.time_to_decision)

    @admin.display(description=_("arguments"))
    def arguments_pretty(self, obj: Approval) -> str:
        text = json.dumps(obj.arguments, indent=2, ensure_ascii=False, sort_keys=True)
        return format_html('<pre class="approvals-arguments">{}</pre>', text)

    @admin.display(description=_("edited arguments (what ran)"))
    def edited_arguments_pretty(self, obj: Approval) -> str:
        if obj.edited_arguments is None:
            return "—"
        text = json.dumps(obj.edited_arguments, indent=2, ensure_ascii=False, sort_keys=True)
        return format_html('<pre class="approvals-arguments">{}</pre>', text)

    # -- the list ------------------------------------------------------------

    def changelist_view(self, request: HttpRequest, extra_context: dict | None = None):
        response = super().changelist_view(request, extra_context)
        context = getattr(response, "context_data", None) or {}
        if "cl" in context and "approvals_dates" not in context:
            # Django's own date hierarchy runs a DISTINCT over every row; see adminlist.
            context["approvals_dates"] = date_hierarchy(context["cl"])
        return response

    # -- search --------------------------------------------------------------

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet, search_term: str
    ) -> tuple[QuerySet, bool]:
        term = search_term.strip()
        if term:
            # Ids are indexed: an exact id answers without scanning every row.
            exact = queryset.filter(Q(approval_id=term) | Q(session_id=term))
            if exact.exists():
                return exact, False
        return super().get_search_results(request, queryset, search_term)

    # -- actions -------------------------------------------------------------

    @admin.action(permissions=["decide"], description=_("Allow selected pending calls"))
    def allow_selected(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
        return self._decide_selected(request, queryset, "allow")

    @admin.action(permissions=["decide"], description=_("Deny selected pending calls"))
    def deny_selected(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
        return self._decide_selected(request, queryset, "deny")

    @admin.action(permissions=["view"], description=_("Export selected calls as CSV"))
    def export_csv(self, request: HttpRequest, queryset: QuerySet) -> StreamingHttpResponse:
        return csv_response(queryset)

    def _decide_selected(
        self, request: HttpRequest, queryset: QuerySet, answer: str
    ) -> HttpResponse | None:
        form = DecideForm(request.POST if request.POST.get("post") == "yes" else None)
        if form.is_bound and form.is_valid():
            decided, skipped = self._decide_each(
                request, queryset, answer, form.cleaned_data["reason"]
            )
            skipped += form.cleaned_data["skipped"] or 0
            level = messages.SUCCESS if decided else messages.WARNING
            self.message_user(
                request, f"Decided {decided}, skipped {skipped} (already decided).", level
            )
            return None
        return self._confirmation(request, queryset, answer, form)

    def _decide_each(
        self, request: HttpRequest, queryset: QuerySet, answer: str, reason: str
    ) -> tuple[int, int]:
        status = status_for_answer(answer)
        pending = queryset.filter(status=Status.PENDING).order_by("created_at", "pk")
        listener.get_listener()  # this process will announce the decisions: its listener runs
        won = []
        for pk, approval_id in pending.values_list("pk", "approval_id"):
            outcome = decide(
                approval_id,
                status,
                via=Via.ADMIN,
                by=request.user,
                viewer=request.user,
                reason=reason,
            )
            if outcome.won:
                won.append(pk)
        return len(won), queryset.exclude(pk__in=won).count()

    def _confirmation(
        self, request: HttpRequest, queryset: QuerySet, answer: str, form: DecideForm
    ) -> HttpResponse | None:
        pending_qs = queryset.filter(status=Status.PENDING).order_by("created_at", "pk")
        batch = list(pending_qs.select_related("user")[: MAX_BATCH + 1])
        over = len(batch) > MAX_BATCH
        batch = batch[:MAX_BATCH]
        skipped = queryset.exclude(status=Status.PENDING).count()
        if not batch:
            self.message_user(
                request, f"Decided 0, skipped {skipped} (already decided).", messages.WARNING
            )
            return None
        if not form.is_bound:
            form = DecideForm(initial={"skipped": skipped})
        for call in batch[:MAX_LISTED]:
            call.arguments_json = json.dumps(call.arguments, ensure_ascii=False, sort_keys=True)
        opts = self.model._meta
        verb = _("Allow") if answer == "allow" else _("Deny")
        context = {
            **self.admin_site.each_context(request),
            "title": _("%(verb)s the selected tool calls?") % {"verb": verb},
            "opts": opts,
            "verb": verb,
            "action": f"{answer}_selected",
            "listed": batch[:MAX_LISTED],
            "batch": batch,
            "more_listed": max(len(batch) - MAX_LISTED, 0),
            "over_batch": over,
            "max_batch": MAX_BATCH,
            "skipped": skipped,
            "form": form,
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "media": self.media,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(
            request, "admin/approvals/approval/decide_selected_confirmation.html", context
        )
