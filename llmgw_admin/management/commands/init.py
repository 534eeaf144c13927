"""Prepare a fresh or existing install: migrate, the roles, the first admin, the guard.

Safe to run again: each step does nothing when it is already done. Used by the README's
first command (run.py). The guard's part: the baseline policy (when none is stored) and
the baseline judge, qwen3guard-0.6b, in the catalog as a CPU guard model (its weights
are fetched by the node that runs it; an air-gapped site points its source at a mirror).
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

    def _guard(self) -> None:
        from catalog.choices import Surface
        from catalog.services import Actor
        from guard import policy as policy_rules
        from guard import services as guard_services
        from guard.models import GuardPolicy

        if not GuardPolicy.objects.exists():
            guard_services.set_policy(
                policy_rules.to_data(policy_rules.BASELINE), surface="cli", name="init"
            )
            self.stdout.write("init: the baseline guard policy")
        name, changed = guard_services.enable_judge(
            policy_rules.BASELINE.judge_models[0],
            gpu=False,
            sim=False,
            actor=Actor(user=None, surface=Surface.CLI, name="init"),
        )
        if changed:
            self.stdout.write(f"init: {name} added to the catalog as the baseline judge")

    def handle(self, *args: Any, **options: Any) -> None:
        call_command("migrate", interactive=False, verbosity=0)
        for role in ROLES:
            Group.objects.get_or_create(name=role)
        self._guard()
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
