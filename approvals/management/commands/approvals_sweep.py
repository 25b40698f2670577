from django.core.management.base import BaseCommand

from approvals.conf import setting
from approvals.decisions import abandon_orphans, expire_overdue


class Command(BaseCommand):
    help = (
        "Record 'expired' for pending tool calls past their deadline and 'abandoned' for "
        "calls whose waiting process stopped. Idempotent; safe while agents wait."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--lease-timeout",
            type=float,
            default=None,
            help="Seconds without a heartbeat after which a waiting process counts as gone "
            "(default: APPROVALS['LEASE_TIMEOUT']).",
        )

    def handle(self, *args, **options):
        lease = options["lease_timeout"] or setting("LEASE_TIMEOUT")
        expired = expire_overdue()
        abandoned = abandon_orphans(lease)
        self.stdout.write(f"expired {expired}, abandoned {abandoned}")
