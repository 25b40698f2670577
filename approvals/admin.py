"""The admin: a read-only audit trail of approvals, with bulk allow/deny for deciders.

Nobody (superusers included) may add, change or delete an ``Approval`` here:
the rows are an audit log. Users with ``approvals.decide_approval`` get the
``allow_selected`` and ``deny_selected`` actions, which decide through
:func:`approvals.decisions.decide` like every other entry point.
"""

from __future__ import annotations

import csv
import json
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.translation import gettext_lazy as _

from . import decisions
from .conf import setting
from .models import Approval, ProcessLease, Status, Via

#: The most pending calls one confirmation page carries (oldest first).
MAX_BATCH = 1000
#: How many of them the confirmation page lists by name.
MAX_LISTED = 100
#: The tool filter offers the tool names of this many latest calls (a bounded query).
TOOL_SAMPLE = 5000


class AwaitingFilter(admin.SimpleListFilter):
    """The quick filter: calls a person can still answer."""

    title = _("awaiting a decision")
    parameter_name = "awaiting"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list:
        return [("yes", _("Yes")), ("no", _("No"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        open_ = Q(status=Status.PENDING, expires_at__gt=timezone.now())
        if self.value() == "yes":
            return queryset.filter(open_)
        if self.value() == "no":
            return queryset.exclude(open_)
        return queryset


class ToolNameFilter(admin.SimpleListFilter):
    """Filter by tool; offers the names seen in the latest calls, not a scan of every row."""

    title = _("tool")
    parameter_name = "tool_name"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list:
        latest = Approval.objects.order_by("-created_at").values_list("tool_name", flat=True)
        names = set(latest[:TOOL_SAMPLE])
        if self.value():
            names.add(self.value())
        return [(name, name or _("(no name)")) for name in sorted(names)]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        if self.value() is None:
            return queryset
        return queryset.filter(tool_name=self.value())


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


def format_duration(value: timedelta | None) -> str:
    """A short human duration: ``"0.4 s"``, ``"12 s"``, ``"3 min 4 s"``, ``"2 h 5 min"``."""
    if value is None:
        return "—"
    seconds = value.total_seconds()
    if seconds < 10:
        return f"{max(seconds, 0):.1f} s"
    seconds = int(seconds)
    minutes, sec = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    if days:
        return f"{days} d {hours} h"
    if hours:
        return f"{hours} h {minutes} min"
    if minutes:
        return f"{minutes} min {sec} s"
    return f"{sec} s"


class _Echo:
    def write(self, value: str) -> str:
        return value


CSV_COLUMNS = (
    "approval_id",
    "session_id",
    "user",
    "tool_name",
    "tool_call_id",
    "arguments",
    "status",
    "decided_via",
    "decided_by",
    "reason",
    "created_at",
    "decided_at",
    "expires_at",
    "seconds_to_decision",
)


def _csv_cell(value: Any) -> str:
    if value is None:
        return ""
    text = str(value)
    # A spreadsheet would run a cell starting like a formula; agents write these values.
    if text[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + text
    return text


def csv_rows(queryset: QuerySet):
    """The header and one row per approval, as lists of strings (streamed in chunks)."""
    yield list(CSV_COLUMNS)
    rows = queryset.select_related("user", "decided_by").order_by("created_at", "pk")
    for a in rows.iterator(chunk_size=2000):
        waited = a.time_to_decision
        yield [
            _csv_cell(v)
            for v in (
                a.approval_id,
                a.session_id,
                a.user.get_username() if a.user else "",
                a.tool_name,
                a.tool_call_id,
                json.dumps(a.arguments, ensure_ascii=False, sort_keys=True),
                a.status,
                a.decided_via,
                a.decided_by.get_username() if a.decided_by else "",
                a.reason,
                a.created_at.isoformat(),
                a.decided_at.isoformat() if a.decided_at else "",
                a.expires_at.isoformat(),
                f"{waited.total_seconds():.3f}" if waited is not None else "",
            )
        ]


@admin.register(Approval)
class ApprovalAdmin(admin.ModelAdmin):
    list_display = (
        "created_at",
        "user",
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
        ToolNameFilter,
        ("created_at", admin.DateFieldListFilter),
    )
    search_fields = ("approval_id", "session_id", "tool_name")
    search_help_text = _(
        "An exact approval id or session id finds it at once; anything else searches "
        "ids, sessions and tool names for the text."
    )
    date_hierarchy = "created_at"
    list_select_related = ("user", "decided_by")
    show_full_result_count = False
    sortable_by = ("created_at",)
    ordering = ("-created_at",)
    actions = ("allow_selected", "deny_selected", "export_csv")
    readonly_fields = ("arguments_pretty", "time_to_decision_display")
    fieldsets = (
        (None, {"fields": ("approval_id", "tool_name", "tool_call_id", "arguments_pretty")}),
        (_("Whose"), {"fields": ("user", "session_id")}),
        (_("Outcome"), {"fields": ("status", "decided_via", "decided_by", "reason")}),
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
        return request.user.has_perm("approvals.decide_approval")

    def get_actions(self, request: HttpRequest) -> dict:
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)
        return actions

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
        writer = csv.writer(_Echo())
        stamp = timezone.now().strftime("%Y%m%d-%H%M%S")
        response = StreamingHttpResponse(
            (writer.writerow(row) for row in csv_rows(queryset)),
            content_type="text/csv; charset=utf-8",
        )
        response["Content-Disposition"] = f'attachment; filename="approvals-{stamp}.csv"'
        return response

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
        status = decisions.status_for_answer(answer)
        pending = queryset.filter(status=Status.PENDING).order_by("created_at", "pk")
        won = []
        for pk, approval_id in pending.values_list("pk", "approval_id"):
            outcome = decisions.decide(
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
