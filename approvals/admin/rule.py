"""The rules admin: standing answers, their form and list filters.

Users with ``approvals.decide_approval`` (and superusers) manage every rule;
everyone else sees, edits and creates only rules for themselves, and the form
refuses a rule for anybody else (or for every user).
"""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from .. import listener, rules
from ..models import Rule
from ..permissions import may_decide_any


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
        if self.value() == "active":
            return queryset.live()
        if self.value() == "expired":
            return queryset.filter(expires_at__lte=timezone.now())
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


@admin.register(Rule)
class RuleAdmin(admin.ModelAdmin):
    """Standing answers: who, which session, which tool (and arguments), allow or deny."""

    form = RuleForm
    list_display = (
        "tool_name",
        "decision",
        "user_display",
        "session_display",
        "arguments_display",
        "created_by",
        "created_at",
        "expires_at",
        "note",
    )
    list_filter = (
        RuleStateFilter,
        "decision",
        RuleScopeFilter,
        ("created_at", admin.DateFieldListFilter),
    )
    search_fields = ("tool_name", "session_id", "note")
    list_select_related = ("user", "created_by")
    ordering = ("-created_at", "-pk")
    fields = (*RuleForm.Meta.fields, "created_by", "created_at", "updated_at")
    readonly_fields = ("created_by", "created_at", "updated_at")

    def manages_all(self, request: HttpRequest) -> bool:
        """May this user see and edit every rule, not only their own?"""
        return may_decide_any(request.user)

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        qs = super().get_queryset(request)
        return qs if self.manages_all(request) else qs.filter(user_id=request.user.pk)

    def get_search_fields(self, request: HttpRequest) -> tuple:
        return (*self.search_fields, f"user__{request.user.USERNAME_FIELD}")

    def _mine(self, request: HttpRequest, obj: Any) -> bool:
        return obj is None or self.manages_all(request) or obj.user_id == request.user.pk

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        allowed = super().has_view_permission(request, obj) or self.manages_all(request)
        return allowed and self._mine(request, obj)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return super().has_add_permission(request) or self.manages_all(request)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        allowed = super().has_change_permission(request, obj) or self.manages_all(request)
        return allowed and self._mine(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        allowed = super().has_delete_permission(request, obj) or self.manages_all(request)
        return allowed and self._mine(request, obj)

    def get_form(self, request: HttpRequest, obj: Any = None, **kwargs: Any) -> type:
        form = super().get_form(request, obj, **kwargs)
        editor = {"editor": request.user, "manages_all": self.manages_all(request)}
        return type(form.__name__, (form,), editor)

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any):
        if db_field.name == "user" and not self.manages_all(request):
            users = db_field.remote_field.model._default_manager
            kwargs.update(queryset=users.filter(pk=request.user.pk), required=True)
            kwargs["empty_label"] = None
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def get_changeform_initial_data(self, request: HttpRequest) -> dict:
        return {"user": request.user.pk, **super().get_changeform_initial_data(request)}

    def save_model(self, request: HttpRequest, obj: Rule, form: Any, change: bool) -> None:
        listener.get_listener()  # so the change reaches the other processes at once
        if not change:
            obj.created_by = request.user
        super().save_model(request, obj, form, change)

    @admin.display(description=_("user"), ordering="user")
    def user_display(self, obj: Rule) -> str:
        return str(obj.user) if obj.user_id else _("every user")

    @admin.display(description=_("session"), ordering="session_id")
    def session_display(self, obj: Rule) -> str:
        return obj.session_id or _("every session")

    @admin.display(description=_("arguments match"))
    def arguments_display(self, obj: Rule) -> str:
        if not obj.arguments_match:
            return "—"
        return json.dumps(obj.arguments_match, ensure_ascii=False, sort_keys=True)
