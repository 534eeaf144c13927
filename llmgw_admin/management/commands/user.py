"""Create users with a role, or change a user's role, from the command line."""

from __future__ import annotations

import secrets
from typing import Any

from django.contrib.auth.models import Group, User
from django.core.management.base import BaseCommand, CommandError

from llmgw_core.roles import ROLES


class Command(BaseCommand):
    help = "Users: create NAME --role ROLE (password printed once), role NAME ROLE."

    def add_arguments(self, parser: Any) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        create = sub.add_parser("create")
        create.add_argument("username")
        create.add_argument("--role", choices=ROLES, required=True)
        role = sub.add_parser("role")
        role.add_argument("username")
        role.add_argument("role", choices=ROLES)

    def handle(self, *args: Any, **options: Any) -> None:
        group = Group.objects.get_or_create(name=options["role"])[0]
        if options["action"] == "create":
            if User.objects.filter(username=options["username"]).exists():
                raise CommandError(f"user {options['username']!r} exists: use 'user role'")
            password = secrets.token_urlsafe(12)
            user = User.objects.create_user(options["username"], password=password, is_staff=True)
            user.groups.add(group)
            self.stdout.write(
                f"user {user} ({options['role']}); password, shown only now: {password}"
            )
            return
        user = User.objects.filter(username=options["username"]).first()
        if user is None:
            raise CommandError(f"no user {options['username']!r}")
        user.groups.remove(*Group.objects.filter(name__in=ROLES))
        user.groups.add(group)
        user.is_staff = True
        user.save(update_fields=["is_staff"])
        self.stdout.write(f"user {user} is now {options['role']}")
