"""Prepare a fresh or existing install: migrate, the roles, the first admin, the guard, the demo.

Safe to run again: each step does nothing when it is already done, and nothing an
operator deleted or changed is put back (the change log remembers what init did). Used
by the README's first command (run.py).

1. The guard: the baseline policy (when none is stored) and the baseline judge,
   qwen3guard-0.6b, in the catalog as a CPU guard model, the first time only (its
   weights are fetched by the node that runs it; an air-gapped site points its source at
   a mirror, and init leaves that alone).
2. The demo (``llmgw_admin.demo``), when ``LLMGW_SIMULATE`` names simulated nodes and
   nobody but init has changed the catalog or the policy: demo models on the simulated
   GPU classes and a sim judge after the baseline one in the policy.
"""

from __future__ import annotations

import secrets
from typing import Any

from django.conf import settings
from django.contrib.auth.models import Group, User
from django.core.management import call_command
from django.core.management.base import BaseCommand
from django.db import transaction

from catalog.choices import Surface
from catalog.models import ChangeRecord
from catalog.services import Actor, Refused
from guard import policy as policy_rules
from guard import services as guard_services
from guard.models import GuardPolicy
from guard.services import PolicyRefused
from llmgw_admin import demo
from llmgw_admin.demo import INIT_ACTOR as INIT
from llmgw_core.roles import ADMIN, ROLES


class Command(BaseCommand):
    help = (
        "Migrate, create the roles and, on a new install, the first admin (password printed once)."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--admin-username", default="admin")

    def _guard(self) -> None:
        if not GuardPolicy.objects.exists():
            guard_services.set_policy(
                policy_rules.to_data(policy_rules.BASELINE), surface="cli", name=INIT
            )
            self.stdout.write("init: the baseline guard policy")
        judge = policy_rules.BASELINE.judge_models[0]
        # Once: an operator may since have pointed it at a mirror, or deleted it.
        if ChangeRecord.objects.filter(model_name=judge).exists():
            return
        name, changed = guard_services.enable_judge(
            judge, gpu=False, sim=False, actor=Actor(user=None, surface=Surface.CLI, name=INIT)
        )
        if changed:
            self.stdout.write(f"init: {name} added to the catalog as the baseline judge")

    def _demo(self) -> None:
        nodes = settings.LLMGW_SIMULATE
        if not nodes or not demo.untouched():
            return
        try:
            lines = demo.install(nodes)
        except (Refused, PolicyRefused) as exc:
            # A demo the rules refuse must not stop the start: say why, add nothing.
            self.stderr.write(f"init: the demo catalog was not added: {exc}")
            return
        for line in lines:
            self.stdout.write(line)

    def handle(self, *args: Any, **options: Any) -> None:
        call_command("migrate", interactive=False, verbosity=0)
        for role in ROLES:
            Group.objects.get_or_create(name=role)
        self._guard()
        self._demo()
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
