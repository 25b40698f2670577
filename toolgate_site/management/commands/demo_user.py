from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Create (or reset) the demo user and print how to sign in."

    def add_arguments(self, parser):
        parser.add_argument("--username", default="demo")
        parser.add_argument("--password", default="demo-password")
        parser.add_argument("--url", default="http://127.0.0.1:8000/approvals/")

    def handle(self, *args, username, password, url, **options):
        User = get_user_model()
        user, _ = User.objects.get_or_create(username=username)
        user.set_password(password)
        user.is_staff = True
        user.save()
        perm = Permission.objects.get(
            codename="decide_approval", content_type__app_label="approvals"
        )
        user.user_permissions.add(perm)
        view = Permission.objects.get(codename="view_approval", content_type__app_label="approvals")
        user.user_permissions.add(view)
        self.stdout.write(
            "\n  Demo user ready.\n"
            f"    open      {url}\n"
            f"    username  {username}\n"
            f"    password  {password}\n"
        )
