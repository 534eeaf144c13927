"""The guard from the command line: judges, checks and prompts.

manage.py guard judge list
manage.py guard judge enable [NAME] [--gpu] [--sim]
manage.py guard judge use NAME [NAME ...]
manage.py guard check --request TEXT [--answer TEXT]
manage.py guard prompt --judge NAME --request-file F [--answer-file G]
"""

from __future__ import annotations

import getpass
import json
import socket
import sys
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from catalog.choices import Surface
from guard import formats, known, services


def _cli_name() -> str:
    return f"{getpass.getuser()}@{socket.gethostname()}"


class Command(BaseCommand):
    help = "Guard: judge list|enable|use, check, prompt."

    def add_arguments(self, parser: Any) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        judge = sub.add_parser("judge", help="the known judges")
        jsub = judge.add_subparsers(dest="judge_action", required=True)
        jsub.add_parser("list", help="known judges, and which the catalog and policy have")
        enable = jsub.add_parser("enable", help="add a known judge to the catalog and serve it")
        enable.add_argument("name", nargs="?", help="default: qwen3guard-0.6b (the 4B with --gpu)")
        enable.add_argument(
            "--gpu", action="store_true", help="on the GPU class with the most memory"
        )
        enable.add_argument("--sim", action="store_true", help="on the sim engine (tests, demos)")
        use = jsub.add_parser("use", help="set the policy's judges, in order")
        use.add_argument("names", nargs="+")
        check = sub.add_parser("check", help="judge a text with the policy; print JSON")
        check.add_argument("--request", required=True)
        check.add_argument("--answer")
        prompt = sub.add_parser("prompt", help="print exactly the prompt a judge receives")
        prompt.add_argument("--judge", required=True)
        prompt.add_argument("--request-file", required=True)
        prompt.add_argument("--answer-file")

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        if action == "check":
            result = services.check(options["request"], options.get("answer"))
            self.stdout.write(json.dumps(result, indent=2))
        elif action == "prompt":
            self._prompt(options)
        else:
            self._judge(options)

    def _judge(self, options: dict[str, Any]) -> None:
        sub = options["judge_action"]
        if sub == "list":
            policy = services.current_policy()
            in_catalog = {j.name: j for j in services.judges(list(known.KNOWN))}
            for name, kj in known.KNOWN.items():
                where = "in catalog" if in_catalog[name].format else "not in catalog"
                order = (
                    f"policy #{policy.judge_models.index(name) + 1}"
                    if name in policy.judge_models
                    else "-"
                )
                self.stdout.write(
                    f"{name}\t{kj.format}\tctx {kj.context_length}\t{kj.min_memory_gb} GB CPU"
                    f" / {kj.gpu_gb:g} GB GPU\t{where}\t{order}"
                )
        elif sub == "enable":
            from catalog.services import Actor, Refused

            try:
                name, changed = services.enable_judge(
                    options["name"], gpu=options["gpu"], sim=options["sim"],
                    actor=Actor(user=None, surface=Surface.CLI, name=_cli_name()),
                )  # fmt: skip
            except ValueError as exc:
                raise CommandError(str(exc)) from None
            except Refused as exc:
                raise CommandError("; ".join(p.line() for p in exc.problems)) from None
            self.stdout.write(f"{name}: {'enabled' if changed else 'already enabled as asked'}")
        else:
            try:
                lines = services.use_judges(options["names"], surface="cli", name=_cli_name())
            except (ValueError, services.PolicyRefused) as exc:
                raise CommandError(str(exc)) from None
            self.stdout.write(f"judges: {', '.join(options['names'])}")
            for line in lines:
                self.stdout.write(line)

    def _prompt(self, options: dict[str, Any]) -> None:
        (judge,) = services.judges([options["judge"]])
        fmt = judge.format or (
            known.KNOWN[judge.name].format if judge.name in known.KNOWN else None
        )
        if fmt is None:
            raise CommandError(
                f'"{options["judge"]}" is neither a guard model in the catalog nor a known judge'
            )
        try:
            request = Path(options["request_file"]).read_text(encoding="utf-8")
            answer = (
                Path(options["answer_file"]).read_text(encoding="utf-8")
                if options.get("answer_file")
                else None
            )
        except OSError as exc:
            raise CommandError(str(exc)) from None
        prompts = formats.get(fmt).prompts(
            request, answer, categories=judge.categories or None, variant=judge.variant,
            for_raw_completion=formats.get(fmt).raw_completion,
        )  # fmt: skip
        # Exactly what is sent, nothing else: ShieldGemma's one prompt per policy are
        # separated by a line holding only a form feed.
        sys.stdout.write("\n\f\n".join(p.text for p in prompts))
