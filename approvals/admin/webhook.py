"""Webhooks (edited here, the secret write-only) and their deliveries (read-only, retryable)."""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.utils.translation import gettext_lazy as _

from .. import notify_worker, outbox
from ..models import Delivery, Webhook
from ..notify_models import WEBHOOK_EVENTS


class WebhookForm(forms.ModelForm):
    url = forms.URLField(label=_("URL"), max_length=2000, assume_scheme="https")
    events = forms.MultipleChoiceField(
        choices=[(str(e), str(e)) for e in WEBHOOK_EVENTS],
        widget=forms.CheckboxSelectMultiple,
        required=False,
    )
    secret = forms.CharField(
        required=False,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text=_(
            "Signs every body (X-Toolgate-Signature). Never shown again; "
            "leave empty to keep the current one."
        ),
    )

    class Meta:
        model = Webhook
        fields = ["name", "url", "format", "events", "user", "active", "secret"]

    def clean_secret(self) -> str:
        value = self.cleaned_data.get("secret") or ""
        return value or (self.instance.secret if self.instance.pk else "")


@admin.register(Webhook)
class WebhookAdmin(admin.ModelAdmin):
    form = WebhookForm
    list_display = ["__str__", "url", "format", "events", "user", "active", "has_secret"]
    list_filter = ["active", "format"]
    search_fields = ["name", "url"]
    actions = ["send_test"]

    @admin.display(boolean=True, description=_("secret set"))
    def has_secret(self, obj: Webhook) -> bool:
        return bool(obj.secret)

    @admin.action(description=_("Send a test delivery"))
    def send_test(self, request, queryset) -> None:
        count = 0
        for hook in queryset:
            outbox.test_delivery(hook)
            count += 1
        notify_worker.wake()
        self.message_user(
            request, f"Queued {count} test deliveries; see Deliveries.", messages.SUCCESS
        )


@admin.register(Delivery)
class DeliveryAdmin(admin.ModelAdmin):
    list_display = [
        "delivery_id",
        "event",
        "target",
        "status",
        "attempts",
        "last_status_code",
        "short_error",
        "created_at",
        "next_attempt_at",
        "delivered_at",
    ]
    list_filter = ["status", "event", "webhook"]
    search_fields = ["=delivery_id", "approval__approval_id", "email_to", "webhook__url"]
    list_select_related = ["webhook"]
    readonly_fields = [f.name for f in Delivery._meta.fields]
    actions = ["retry"]

    @admin.display(description=_("last error"))
    def short_error(self, obj: Delivery) -> str:
        return obj.last_error[:120]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_retry_permission(self, request) -> bool:
        return request.user.has_perm("approvals.change_webhook")

    @admin.action(description=_("Retry now"), permissions=["retry"])
    def retry(self, request, queryset) -> None:
        count = outbox.retry(queryset)
        notify_worker.wake()
        self.message_user(request, f"Retrying {count} deliveries.", messages.SUCCESS)
