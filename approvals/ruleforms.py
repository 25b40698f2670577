"""The admin's rule form and list filters (the ``RuleAdmin`` itself is in ``admin.py``).

Users with ``approvals.decide_approval`` (and superusers) manage every rule;
everyone else sees, edits and creates only rules for themselves, and the form
refuses a rule for anybody else (or for every user).
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.db.models import Q, QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from . import rules
from .models import Rule


class RuleForm(forms.ModelForm):
    """A rule as edited in the admin; :meth:`RuleAdmin.get_form` says who edits it."""

    editor: Any = None
    manages_all = False

    class Meta:
        model = Rule
        fields = (
            "user",
            "session_id",
            "tool_name",
            "arguments_match",
            "decision",
            "expires_at",
            "note",
        )

    def clean_user(self) -> Any:
        user = self.cleaned_data.get("user")
        editor_pk = getattr(self.editor, "pk", None)  # no editor known: nobody's rule is ok
        if not self.manages_all and (user is None or editor_pk is None or user.pk != editor_pk):
            raise forms.ValidationError(
                _("You may only hold rules for yourself."), code="not_yours"
            )
        return user

    def clean_arguments_match(self) -> dict | None:
        try:
            return rules.clean_arguments_match(self.cleaned_data.get("arguments_match"))
        except ValueError as exc:
            raise forms.ValidationError(str(exc), code="invalid") from None


class RuleStateFilter(admin.SimpleListFilter):
    title = _("state")
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> tuple:
        return (("active", _("active")), ("expired", _("expired")))

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        now = timezone.now()
        if self.value() == "active":
            return queryset.filter(Q(expires_at__isnull=True) | Q(expires_at__gt=now))
        if self.value() == "expired":
            return queryset.filter(expires_at__lte=now)
        return queryset


class RuleScopeFilter(admin.SimpleListFilter):
    title = _("scope")
    parameter_name = "scope"

    def lookups(self, request: HttpRequest, model_admin: Any) -> tuple:
        return (
            ("every_user", _("every user")),
            ("one_user", _("one user, every session")),
            ("one_session", _("one session")),
        )

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        if self.value() == "every_user":
            return queryset.filter(user__isnull=True)
        if self.value() == "one_user":
            return queryset.filter(user__isnull=False, session_id="")
        if self.value() == "one_session":
            return queryset.exclude(session_id="")
        return queryset
