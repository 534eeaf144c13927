"""Prepare a fresh or existing install: migrate, create the roles and the first admin.

Safe to run again: each step does nothing when it is already done. Used by the README's
first command (run.py).
"""

from __future__ import annotations

import secrets
from typing import Any

from django.contrib.auth.models import Group, User
from django.core.management import call_command
from django.core.management.base import BaseCommand
from django.db import transaction

from llmgw_admin.roles import ADMIN, ROLES


class Command(BaseCommand):
    help = (
        "Migrate, create the roles and, on a new install, the first admin (password printed once)."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--admin-username", default="admin")

    def handle(self, *args: Any, **options: Any) -> None:
        call_command("migrate", interactive=False, verbosity=0)
        for role in ROLES:
            Group.objects.get_or_create(name=role)
        with transaction.atomic():
            if User.objects.exists():
                self.stdout.write("init: users exist; no admin created")
                return
            password = secrets.token_urlsafe(12)
            user = User.objects.create_user(
                options["admin_username"], password=password, is_staff=True, is_superuser=True
            )
            user.groups.add(Group.objects.get(name=ADMIN))
        self.stdout.write(
            self.style.SUCCESS(
                "init: first admin created. Sign in with\n"
                f"    username: {user.username}\n"
                f"    password: {password}\n"
                "This password is shown only now: change it after signing in."
            )
        )
