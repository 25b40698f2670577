from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class ApprovalsConfig(AppConfig):
    name = "approvals"
    verbose_name = _("Tool approvals")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Importing registers the checks and the setting_changed receivers.
        from . import (  # noqa: F401
            checks,
            conf,
            listener,
            notify_worker,
            outbox,
            rules,
            sweep,
            walcheck,
            wsroute,
        )
        from .conf import setting

        # The listener knows nothing above it; the parts that need it hook in here.
        rules.connect()
        listener.every("sweep", lambda: setting("SWEEP_INTERVAL"), sweep.sweep, judges_leases=True)
        # Notifications: the outbox is written inside the decision path's transactions
        # (approvals.hooks), sent by a worker beside the listener, reminders periodic.
        outbox.connect()
        outbox.on_written(notify_worker.wake)
        listener.on_start("notify", notify_worker.start)
        listener.every("remind", lambda: 2.0, outbox.remind)
        # SQLite: the WAL copied back beside the listener, not in a request's commit.
        listener.on_start("checkpoints", walcheck.start)
