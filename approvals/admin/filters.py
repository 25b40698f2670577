"""List filters that never scan the table, and how a wait is shown."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.translation import gettext_lazy as _

from ..models import awaiting_q

#: The tool filter offers the tool names of this many latest calls (a bounded query).
TOOL_SAMPLE = 5000


class AwaitingFilter(admin.SimpleListFilter):
    """The quick filter: calls a person can still answer."""

    title = _("awaiting a decision")
    parameter_name = "awaiting"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list:
        return [("yes", _("Yes")), ("no", _("No"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        if self.value() == "yes":
            return queryset.filter(awaiting_q())
        if self.value() == "no":
            return queryset.exclude(awaiting_q())
        return queryset


class RecentValuesFieldListFilter(admin.AllValuesFieldListFilter):
    """Django's "all values" filter, offering the values of the latest calls only.

    Django's own runs a ``DISTINCT`` over every row to list the choices; this one
    reads the latest ``TOOL_SAMPLE`` rows through the creation-time index. The
    URL parameter and the filtering are Django's (``?tool_name=…``).
    """

    def __init__(self, field, request, params, model, model_admin, field_path) -> None:
        super().__init__(field, request, params, model, model_admin, field_path)
        latest = model._default_manager.order_by("-created_at").values_list(field.name, flat=True)
        values = set(latest[:TOOL_SAMPLE])
        chosen = self.lookup_val or []
        values.update([chosen] if isinstance(chosen, str) else chosen)
        self.lookup_choices = sorted(v for v in values if v is not None)


def format_duration(value: timedelta | None) -> str:
    """A short human duration: ``"0.4 s"``, ``"12 s"``, ``"3 min 4 s"``, ``"2 h 5 min"``."""
    if value is None:
        return "—"
    seconds = value.total_seconds()
    if seconds < 10:
        return f"{max(seconds, 0):.1f} s"
    minutes, sec = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    if days:
        return f"{days} d {hours} h"
    if hours:
        return f"{hours} h {minutes} min"
    if minutes:
        return f"{minutes} min {sec} s"
    return f"{sec} s"


# -- date hierarchy ------------------------------------------------------------
