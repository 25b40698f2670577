from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from approvals import agentkeys


class Command(BaseCommand):
    help = (
        "Manage agent keys (Authorization: Bearer keys for agents outside Django): "
        "'create --user USERNAME --name NAME' prints the new key alone on its last line; "
        "'revoke NAME'; 'list'."
    )

    def add_arguments(self, parser):
        actions = parser.add_subparsers(dest="action", required=True)
        create = actions.add_parser("create", help="Create a key; it is shown only this once.")
        create.add_argument("--user", required=True, help="The user the agent acts for.")
        create.add_argument("--name", required=True, help="A unique name for the key.")
        revoke = actions.add_parser("revoke", help="Revoke a key: it stops working at once.")
        revoke.add_argument("name")
        actions.add_parser("list", help="List every key (prefix, user, dates); never the key.")

    def handle(self, *args, **options):
        action = options["action"]
        if action == "create":
            self._create(options["user"], options["name"])
        elif action == "revoke":
            if not agentkeys.revoke_key(options["name"]):
                raise CommandError(f"No live agent key named {options['name']!r}.")
            self.stdout.write(f"Revoked agent key {options['name']!r}.")
        else:
            self._list()

    def _create(self, username: str, name: str) -> None:
        User = get_user_model()
        try:
            user = User._default_manager.get_by_natural_key(username)
        except User.DoesNotExist:
            raise CommandError(f"No user {username!r}.") from None
        try:
            key, raw = agentkeys.create_key(user, name)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(
            f"Created agent key {key.name!r} (prefix {key.prefix}) for {username}. "
            "It is shown only now; store it safely:"
        )
        self.stdout.write(raw)

    def _list(self) -> None:
        keys = agentkeys.list_keys()
        if not keys:
            self.stdout.write("No agent keys.")
        for key in keys:
            used = key.last_used_at.isoformat() if key.last_used_at else "never"
            state = f"revoked {key.revoked_at.isoformat()}" if key.revoked_at else "active"
            self.stdout.write(
                f"{key.name}\t{key.prefix}\t{key.user.get_username()}\t"
                f"created {key.created_at.isoformat()}\tlast used {used}\t{state}"
            )
