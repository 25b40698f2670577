"""Webhooks, the notification outbox and reminders: the tables behind reaching the approver.

Imported by :mod:`approvals.models` (``approvals.models.Webhook``); kept apart
so the audit log's module stays small. Nothing here imports the app.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone
from django.utils.translation import gettext_lazy as _


class Event(models.TextChoices):
    REQUESTED = "approval.requested", "approval.requested"
    DECIDED = "approval.decided", "approval.decided"
    EXPIRING = "approval.expiring", "approval.expiring"
    TEST = "ping", "ping"


#: The events a webhook may subscribe to.
WEBHOOK_EVENTS = (Event.REQUESTED, Event.DECIDED, Event.EXPIRING)


def all_events() -> list[str]:
    return [str(e) for e in WEBHOOK_EVENTS]


class Webhook(models.Model):
    """A receiver of signed POSTs about calls (``json`` or a Slack incoming webhook)."""

    class Format(models.TextChoices):
        JSON = "json", _("JSON (signed)")
        SLACK = "slack", _("Slack incoming webhook")

    name = models.CharField(_("name"), max_length=100, blank=True)
    url = models.URLField(_("URL"), max_length=2000)
    secret = models.CharField(
        _("secret"),
        max_length=255,
        blank=True,
        help_text=_("Signs every body (X-Toolgate-Signature: sha256=<HMAC-SHA256 hex>)."),
    )
    events = models.JSONField(
        _("events"),
        default=all_events,
        help_text=_("Any of approval.requested, approval.decided, approval.expiring."),
    )
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        verbose_name=_("user"),
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="approval_webhooks",
        help_text=_("Only this user's calls; empty means every user's."),
    )
    format = models.CharField(_("format"), max_length=8, choices=Format.choices, default="json")
    active = models.BooleanField(_("active"), default=True)
    created_at = models.DateTimeField(_("created"), default=timezone.now)

    class Meta:
        verbose_name = _("webhook")
        verbose_name_plural = _("webhooks")
        ordering = ["pk"]

    def __str__(self) -> str:
        return self.name or self.url


class DeliveryStatus(models.TextChoices):
    PENDING = "pending", _("pending")
    DELIVERED = "delivered", _("delivered")
    FAILED = "failed", _("failed")


class Delivery(models.Model):
    """One message to send (a webhook POST or an email): the outbox row.

    Written in the transaction of the change it reports; sent by one process's
    worker (claimed with a conditional update and a lease), retried with backoff.
    """

    delivery_id = models.UUIDField(_("delivery id"), default=uuid.uuid4, unique=True)
    webhook = models.ForeignKey(
        Webhook,
        verbose_name=_("webhook"),
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="deliveries",
    )
    email_to = models.CharField(_("email to"), max_length=254, blank=True)
    event = models.CharField(_("event"), max_length=32, choices=Event.choices)
    approval = models.ForeignKey(
        "approvals.Approval",
        verbose_name=_("approval"),
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="deliveries",
    )
    body = models.TextField(_("body"), help_text=_("Exactly what is sent."))
    status = models.CharField(
        _("status"), max_length=12, choices=DeliveryStatus.choices, default="pending"
    )
    attempts = models.PositiveIntegerField(_("attempts"), default=0)
    next_attempt_at = models.DateTimeField(_("next attempt"), default=timezone.now)
    claimed_until = models.DateTimeField(_("claimed until"), null=True, blank=True)
    claimed_by = models.CharField(_("claimed by"), max_length=100, blank=True)
    last_error = models.TextField(_("last error"), blank=True)
    last_status_code = models.PositiveIntegerField(_("last status code"), null=True, blank=True)
    created_at = models.DateTimeField(_("created"), default=timezone.now)
    delivered_at = models.DateTimeField(_("delivered"), null=True, blank=True)

    class Meta:
        verbose_name = _("delivery")
        verbose_name_plural = _("deliveries")
        ordering = ["-created_at", "-pk"]
        indexes = [
            models.Index(
                fields=["next_attempt_at"],
                condition=Q(status="pending"),
                name="approvals_delivery_due",
            ),
            models.Index(fields=["-created_at"], name="approvals_delivery_latest"),
        ]

    def __str__(self) -> str:
        return f"{self.event} → {self.webhook or self.email_to} [{self.status}]"

    @property
    def target(self) -> str:
        return self.webhook.url if self.webhook_id else f"mailto:{self.email_to}"


class Reminder(models.Model):
    """That ``approval.expiring`` fired for a call: one row per call, so it fires once."""

    approval = models.OneToOneField(
        "approvals.Approval", on_delete=models.CASCADE, related_name="reminder"
    )
    sent_at = models.DateTimeField(default=timezone.now)

    class Meta:
        verbose_name = _("reminder")
        verbose_name_plural = _("reminders")
        default_permissions = ()

    def __str__(self) -> str:
        return f"reminder for {self.approval_id}"
