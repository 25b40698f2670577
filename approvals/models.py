"""The audit log (``Approval``), standing rules (``Rule``), process leases, and their vocabulary.

The queries every part of the app asks of these tables live here, on the
querysets (``Approval.objects.visible_to(user).awaiting()``), so the views,
the consumer and the admin cannot drift apart.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import models
from django.db.models import Q
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from . import events
from .permissions import DECIDE_CODENAME, may_decide_any


class Status(models.TextChoices):
    PENDING = "pending", _("pending")
    ALLOWED = "allowed", _("allowed")
    DENIED = "denied", _("denied")
    EXPIRED = "expired", _("expired")
    CANCELLED = "cancelled", _("cancelled")
    ABANDONED = "abandoned", _("abandoned")


class Via(models.TextChoices):
    WEB = "web", _("web")
    WEBSOCKET = "websocket", _("websocket")
    ADMIN = "admin", _("admin")
    API = "api", _("api")
    RULE = "rule", _("rule")
    TIMEOUT = "timeout", _("timeout")
    CANCEL = "cancel", _("cancel")
    SWEEP = "sweep", _("sweep")


class Answer(models.TextChoices):
    """What a person (or a rule) answers: the words every entry point takes."""

    ALLOW = "allow", _("allow")
    DENY = "deny", _("deny")


FINAL_STATUSES = frozenset(s for s in Status.values if s != Status.PENDING)
PENDING = Q(status=Status.PENDING)
#: The status each answer records.
ANSWER_STATUS = {Answer.ALLOW: Status.ALLOWED, Answer.DENY: Status.DENIED}
#: How far a remembered decision reaches: this session, or every session.
REMEMBER_SCOPES = ("session", "always")


def status_for_answer(answer: Any) -> str:
    """Map ``"allow"``/``"deny"`` to a status; anything else raises ``ValueError``."""
    if not isinstance(answer, str) or answer not in ANSWER_STATUS:
        raise ValueError(f'decision must be "allow" or "deny", not {answer!r}')
    return ANSWER_STATUS[answer]


def answer_for_status(status: str) -> str:
    """``"allow"`` for an allowed call, ``"deny"`` for every other outcome."""
    return Answer.ALLOW if status == Status.ALLOWED else Answer.DENY


def awaiting_q(now: datetime | None = None) -> Q:
    """Pending and not yet past its deadline: a call a person can still answer."""
    return PENDING & Q(expires_at__gt=now or timezone.now())


class ApprovalQuerySet(models.QuerySet):
    def visible_to(self, user: Any) -> ApprovalQuerySet:
        """The approvals ``user`` may see and decide (see :mod:`approvals.permissions`)."""
        if may_decide_any(user):
            return self
        return self.filter(user_id=user.pk)

    def awaiting(self, now: datetime | None = None) -> ApprovalQuerySet:
        """Pending and not yet past their deadline: what a person can still answer."""
        return self.filter(awaiting_q(now))

    def in_session(self, session_id: str | None) -> ApprovalQuerySet:
        """Narrowed to one session; ``None`` or ``""`` leaves every session."""
        return self.filter(session_id=session_id) if session_id else self

    def decided(self) -> ApprovalQuerySet:
        return self.exclude(PENDING)

    def pending_items(self, limit: int) -> list[dict]:
        """Oldest first, as ``tool-approvals``, the snapshot and ``tool_start`` list them."""
        owner = models.F(f"user__{get_user_model().USERNAME_FIELD}")
        rows = self.annotate(owner=owner).order_by("created_at", "pk")
        rows = rows.values(*events.PENDING_FIELDS, "owner")
        return [events.pending_item(row) for row in rows[:limit]]


class Approval(models.Model):
    """One gated tool call and its outcome. Written when the call is gated; never deleted."""

    approval_id = models.CharField(_("approval id"), max_length=128, unique=True)
    session_id = models.CharField(_("session"), max_length=255, db_index=True, blank=True)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        verbose_name=_("user"),
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="tool_approvals",
        help_text=_("Whose agent run the call belongs to."),
    )
    tool_name = models.CharField(_("tool"), max_length=200, blank=True)
    tool_call_id = models.CharField(_("tool call id"), max_length=255, blank=True)
    arguments = models.JSONField(_("arguments"), default=dict, blank=True)
    status = models.CharField(
        _("status"), max_length=16, choices=Status.choices, default=Status.PENDING
    )
    decided_via = models.CharField(_("decided via"), max_length=16, choices=Via.choices, blank=True)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        verbose_name=_("decided by"),
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    reason = models.TextField(_("reason"), blank=True)
    created_at = models.DateTimeField(_("created"), default=timezone.now)
    decided_at = models.DateTimeField(_("decided"), null=True, blank=True)
    expires_at = models.DateTimeField(_("expires"))
    description = models.TextField(
        _("description"), blank=True, help_text=_("Why the agent wants this call, in its words.")
    )
    editable = models.BooleanField(
        _("editable"),
        default=False,
        help_text=_("The agent runs whatever arguments the person approves."),
    )
    arguments_schema = models.JSONField(
        _("arguments schema"),
        null=True,
        blank=True,
        help_text=_("A JSON Schema that edited arguments must satisfy."),
    )
    edited_arguments = models.JSONField(
        _("edited arguments"),
        null=True,
        blank=True,
        help_text=_("The arguments as the person changed them; empty when unchanged."),
    )
    executed_at = models.DateTimeField(_("executed"), null=True, blank=True)
    execution_ok = models.BooleanField(_("execution succeeded"), null=True, blank=True)
    execution_summary = models.TextField(_("execution summary"), blank=True)
    agent_key = models.ForeignKey(
        "approvals.AgentKey",
        verbose_name=_("agent key"),
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="approvals",
        help_text=_("The key of the agent that gated the call over HTTP."),
    )
    agent_seen_at = models.DateTimeField(
        _("agent last seen"),
        null=True,
        blank=True,
        help_text=_("When the agent that gated the call over HTTP last asked about it."),
    )
    waiter = models.CharField(
        _("waiting process"),
        max_length=64,
        blank=True,
        help_text=_("Lease key of the process waiting for the decision; blank when none waits."),
    )

    objects = ApprovalQuerySet.as_manager()

    class Meta:
        verbose_name = _("approval")
        verbose_name_plural = _("approvals")
        ordering = ["-created_at"]
        permissions = [(DECIDE_CODENAME, "Can allow or deny pending tool calls")]
        indexes = [
            models.Index(fields=["-created_at"], name="approvals_latest"),
            models.Index(fields=["status", "-created_at"], name="approvals_status_latest"),
            models.Index(fields=["decided_at"], name="approvals_decided_at"),
            models.Index(fields=["user", "-decided_at"], name="approvals_user_decided"),
            models.Index(
                fields=["user", "created_at"], condition=PENDING, name="approvals_pending_user"
            ),
            models.Index(
                fields=["session_id", "created_at"],
                condition=PENDING,
                name="approvals_pending_session",
            ),
            models.Index(fields=["expires_at"], condition=PENDING, name="approvals_pending_expiry"),
            models.Index(fields=["waiter"], condition=PENDING, name="approvals_pending_waiter"),
            models.Index(
                fields=["agent_seen_at"], condition=PENDING, name="approvals_pending_agent"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tool_name or 'tool'} [{self.status}] {self.approval_id}"

    @property
    def is_pending(self) -> bool:
        return self.status == Status.PENDING

    @classmethod
    def limit(cls, field: str) -> int:
        """The longest value ``field`` holds (the one place field limits are read)."""
        return cls._meta.get_field(field).max_length

    @property
    def time_to_decision(self):
        """How long the call waited for its outcome (``None`` while pending)."""
        if self.decided_at is None:
            return None
        return self.decided_at - self.created_at


class RuleQuerySet(models.QuerySet):
    def live(self, now: datetime | None = None) -> RuleQuerySet:
        """Rules not past their ``expires_at`` (a rule without one never expires)."""
        return self.exclude(expires_at__lte=now or timezone.now())


class Rule(models.Model):
    """A standing answer: calls that match are decided without asking anyone."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        verbose_name=_("user"),
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="tool_rules",
        help_text=_("Whose calls the rule applies to; empty means every user."),
    )
    session_id = models.CharField(
        _("session"), max_length=255, blank=True, help_text=_("Empty means every session.")
    )
    tool_name = models.CharField(
        _("tool"), max_length=200, help_text=_("An exact tool name, or a pattern with *.")
    )
    arguments_match = models.JSONField(
        _("arguments match"),
        null=True,
        blank=True,
        help_text=_(
            'Optional: argument name → pattern with *, e.g. {"cmd": "git status*"}. '
            "Every key given must match."
        ),
    )
    decision = models.CharField(_("decision"), max_length=8, choices=Answer.choices)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        verbose_name=_("created by"),
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    created_at = models.DateTimeField(_("created"), default=timezone.now)
    updated_at = models.DateTimeField(_("updated"), auto_now=True)
    expires_at = models.DateTimeField(_("expires"), null=True, blank=True)
    note = models.TextField(_("note"), blank=True)
    literal = models.BooleanField(
        _("literal tool name"),
        default=False,
        help_text=_(
            "Match the tool name exactly, even if it contains *. Set on rules stored by "
            "a person's remember choice, which are for the one tool they decided."
        ),
    )

    objects = RuleQuerySet.as_manager()

    class Meta:
        verbose_name = _("rule")
        verbose_name_plural = _("rules")
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["updated_at"], name="approvals_rule_updated")]

    def __str__(self) -> str:
        scope = self.session_id or "every session"
        return f"{self.get_decision_display()} {self.tool_name} ({scope})"


class AgentKey(models.Model):
    """A key an agent outside Django presents (``Authorization: Bearer``) to gate calls.

    Calls gated with a key belong to the key's user. Only a hash of the key is
    stored; ``prefix`` is its first characters, shown to tell keys apart.
    """

    name = models.CharField(_("name"), max_length=100, unique=True)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        verbose_name=_("user"),
        on_delete=models.CASCADE,
        related_name="agent_keys",
        help_text=_("The person the agent acts for."),
    )
    prefix = models.CharField(_("prefix"), max_length=16, unique=True)
    key_hash = models.CharField(_("key hash"), max_length=255)
    created_at = models.DateTimeField(_("created"), default=timezone.now)
    last_used_at = models.DateTimeField(_("last used"), null=True, blank=True)
    revoked_at = models.DateTimeField(_("revoked"), null=True, blank=True)

    class Meta:
        verbose_name = _("agent key")
        verbose_name_plural = _("agent keys")
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def is_revoked(self) -> bool:
        return self.revoked_at is not None


class ProcessLease(models.Model):
    """A process that may hold waiting calls, kept alive by its heartbeat."""

    key = models.CharField(max_length=64, unique=True)
    hostname = models.CharField(max_length=255, blank=True)
    pid = models.PositiveIntegerField(default=0)
    started_at = models.DateTimeField(default=timezone.now)
    heartbeat_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        verbose_name = _("process lease")
        verbose_name_plural = _("process leases")
        default_permissions = ("view",)

    def __str__(self) -> str:
        return f"{self.hostname}:{self.pid}"


# Webhooks and the notification outbox live beside, to keep this module small.
from .notify_models import Delivery, Reminder, Webhook  # noqa: E402, F401
