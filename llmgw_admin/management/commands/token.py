"""Issue, list and revoke API tokens from the command line."""

from __future__ import annotations

import getpass
import socket
from datetime import timedelta
from typing import Any

from django.contrib.auth.models import User
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from catalog.durations import DurationError, parse_duration
from llmgw_core.models import ApiToken


class Command(BaseCommand):
    help = "API tokens: create USER NAME [--expires 30d|720h], list, revoke ID."

    def add_arguments(self, parser: Any) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        create = sub.add_parser("create", help="issue a token; its secret is printed once")
        create.add_argument("user")
        create.add_argument("name")
        create.add_argument("--expires", help="a duration from now: 720h, 90m (or Nd for days)")
        sub.add_parser("list", help="list tokens (never their secrets)")
        revoke = sub.add_parser("revoke", help="revoke a token by id")
        revoke.add_argument("id", type=int)

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        if action == "create":
            user = User.objects.filter(username=options["user"]).first()
            if user is None:
                raise CommandError(f"no user {options['user']!r}")
            expires = None
            if options["expires"]:
                text = options["expires"]
                try:
                    if text.endswith("d") and text[:-1].isdigit():
                        delta = timedelta(days=int(text[:-1]))
                    else:
                        delta = timedelta(microseconds=parse_duration(text) / 1000)
                except DurationError as exc:
                    raise CommandError(f"--expires: {exc}") from None
                expires = timezone.now() + delta
            if ApiToken.objects.filter(
                user=user, name=options["name"], revoked__isnull=True
            ).exists():
                raise CommandError(f"{user} already has a live token named {options['name']!r}")
            # Whoever runs manage.py holds the installation: the token says so.
            maker = f"command line ({getpass.getuser()}@{socket.gethostname()})"
            token, secret = ApiToken.issue(user, options["name"], expires, by_name=maker)
            self.stdout.write(
                f"token {token.pk} for {user} ({token.name}); shown only now:\n{secret}"
            )
        elif action == "list":
            for t in ApiToken.objects.select_related("user").order_by("id"):
                self.stdout.write(
                    f"{t.pk}\t{t.user}\t{t.name}\t{t.state}\tby {t.created_by_name or 'unknown'}"
                    f"\texpires {t.expires or 'never'}"
                    f"\tlast used {t.last_used or 'never'}"
                )
        else:
            n = ApiToken.objects.filter(pk=options["id"], revoked__isnull=True).update(
                revoked=timezone.now()
            )
            if not n:
                raise CommandError(f"no live token {options['id']}")
            self.stdout.write(f"token {options['id']} revoked")
