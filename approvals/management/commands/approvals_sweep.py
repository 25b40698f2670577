from django.core.management.base import BaseCommand

from approvals.sweep import sweep


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
        expired, abandoned = sweep(options["lease_timeout"] or None)
        self.stdout.write(f"expired {expired}, abandoned {abandoned}")
