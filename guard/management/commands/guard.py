"""The guard from the command line: judges, checks, prompts, the policy, evaluation.

manage.py guard judge list
manage.py guard judge enable [NAME] [--gpu] [--sim]
manage.py guard judge use NAME [NAME ...]
manage.py guard check --request TEXT [--answer TEXT]
manage.py guard check --endpoint URL --format F --request TEXT [--answer TEXT]
                      [--model NAME] [--variant V] [--categories C ...] [--context-length N]
                      [--timeout S]
manage.py guard prompt --judge NAME (--request TEXT | --request-file F)
                       [--answer TEXT | --answer-file G]
manage.py guard policy show
manage.py guard policy set [--file F] [--judges A [B ...]] [--controversial safe|unsafe]
                           [--fail open|closed] [--directions requests answers|none]
                           [--categories C ...]
manage.py guard eval [--judges A [B ...]] [--set NAME_OR_FILE] [--timeout S]
"""

from __future__ import annotations

import argparse
import dataclasses
import getpass
import json
import logging
import socket
import sys
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from catalog import yamlfile
from catalog.choices import Surface
from catalog.problems import Problem
from catalog.services import Actor, Refused
from cluster.enginekeys import engine_key
from cluster.models import Replica
from guard import checks, client, evalrun, formats, known, services, snapshots
from guard import evaluation as ev
from guard import policy as policy_rules
from guard.chain import JudgeRef, run_chain
from guard.judgeprompt import judge_prompt


def _cli_name() -> str:
    return f"{getpass.getuser()}@{socket.gethostname()}"


class Command(BaseCommand):
    help = "Guard: judge list|enable|use, check, prompt, policy show|set, eval."

    def add_arguments(self, parser: Any) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        _judge_arguments(sub)
        _check_arguments(sub)
        _prompt_arguments(sub)
        _policy_arguments(sub)
        _eval_arguments(sub)
        # An option is taken only as written: "--request" must never be read as
        # "--request-file" (or any prefix as the option it begins).
        _no_abbreviations(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        if action == "check":
            if options.get("endpoint") or options.get("judge_format"):
                self._check_endpoint(options)
                return
            result = checks.check(options["request"], options.get("answer"))
            self.stdout.write(json.dumps(result, indent=2))
        elif action == "prompt":
            self._prompt(options)
        elif action == "policy":
            self._policy(options)
        elif action == "eval":
            self._eval(options)
        else:
            self._judge(options)

    def _judge(self, options: dict[str, Any]) -> None:
        sub = options["judge_action"]
        if sub == "list":
            policy = services.current_policy()
            in_catalog = {j.name: j for j in snapshots.judges(list(known.KNOWN))}
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

    def _check_endpoint(self, options: dict[str, Any]) -> None:
        """Ask one engine as a judge; print what ``guard check`` prints, decided as the
        policy in force would decide with this judge added to it. Nothing is recorded."""
        url, fmt = options.get("endpoint"), options.get("judge_format")
        if not url or not fmt:
            raise CommandError(
                "--endpoint and --format go together: the engine's URL and its judge format "
                f"({', '.join(formats.FORMATS)})"
            )
        if not url.startswith(("http://", "https://")):
            raise CommandError(f'--endpoint "{url}" is not an http:// or https:// URL')
        if not options["timeout"] > 0:
            raise CommandError("--timeout must be a positive number of seconds")
        if not options["context_length"] > 0:
            raise CommandError("--context-length must be a positive number of tokens")
        name = options.get("model") or url
        categories = options.get("categories")
        try:
            variant = formats.get(fmt).variant(options.get("variant"))
        except ValueError as exc:
            raise CommandError(f"--variant: {exc}") from None
        policy = services.current_policy()
        reports = {
            **services.judge_reports(),
            name: formats.reported_categories(fmt, categories, variant),
        }
        order = (*[j for j in policy.judge_models if j != name], name)
        trial, _, _ = policy_rules.complete(
            dataclasses.replace(policy, judge_models=order), reports, drop_unreportable=True
        )
        assert trial is not None  # every judge is one of reports; categories are dropped
        answer = options.get("answer")
        key = _engine_key_at(url)

        def ask(ref: JudgeRef) -> Any:
            return client.ask_judge(
                url, fmt, options["request"], answer,
                context_length=options["context_length"], categories=categories,
                variant=variant, timeout=options["timeout"], model=options.get("model"),
                controversial=trial.controversial, key=key,
            )  # fmt: skip

        # The engine is asked whatever the policy's directions: trying it is the point.
        result = run_chain(
            dataclasses.replace(trial, judge_requests=True, judge_answers=True),
            [JudgeRef(name, ready=True)],
            ask,
            direction=policy_rules.ANSWERS if answer is not None else policy_rules.REQUESTS,
        )
        self.stdout.write(json.dumps(checks.as_json(result), indent=2))
        if result.verdict is None:
            why = "; ".join(f"{f.kind}: {f.message}" for f in result.failures)
            raise CommandError(f"{url} gave no verdict in the {fmt} format: {why}")

    def _prompt(self, options: dict[str, Any]) -> None:
        try:
            request = (
                options["request"]
                if options.get("request") is not None
                else Path(options["request_file"]).read_text(encoding="utf-8")
            )
            if options.get("answer") is not None:
                answer = options["answer"]
            elif options.get("answer_file"):
                answer = Path(options["answer_file"]).read_text(encoding="utf-8")
            else:
                answer = None
        except (OSError, UnicodeDecodeError) as exc:
            raise CommandError(str(exc)) from None
        try:
            text = judge_prompt(options["judge"], request, answer)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        # Exactly what is sent, nothing else (the console's judge page shows the same).
        sys.stdout.write(text)

    # The policy

    def _policy(self, options: dict[str, Any]) -> None:
        if options["policy_action"] == "show":
            data = policy_rules.to_data(services.current_policy())
            self.stdout.write(json.dumps(data, indent=2, ensure_ascii=False))
            return
        data, doc = self._policy_data(options)
        # Categories neither flag nor file gives are the policy in force's: one no listed
        # judge can report is removed (and said) rather than refused.
        given = options.get("categories") is not None or (
            isinstance(data, dict) and bool(options.get("file")) and "categories" in data
        )
        try:
            done = services.save_policy(
                data, surface=Surface.CLI, name=_cli_name(), categories_given=given
            )
        except services.PolicyRefused as exc:
            problems = [
                f"  {yamlfile.where(p.path, doc.line(p.path) if doc else None)}: {p.message}"
                for p in exc.problems
            ]
            raise CommandError(
                "the guard refuses this policy; nothing was changed:\n" + "\n".join(problems)
            ) from None
        self.stdout.write("policy saved" if done.changed else "policy unchanged")
        for note in done.notes:
            self.stdout.write(f"categories: {note}")
        self.stdout.write(
            json.dumps(policy_rules.to_data(done.policy), indent=2, ensure_ascii=False)
        )

    def _policy_data(self, options: dict[str, Any]) -> tuple[Any, yamlfile.Document | None]:
        """Return the policy data the file and flags ask for, and the file read."""
        flags = [k for k in ("judges", "controversial", "fail", "directions", "categories")
                 if options.get(k) is not None]  # fmt: skip
        if not options.get("file") and not flags:
            raise CommandError(
                "nothing to set: give --file and/or --judges, --controversial, --fail, "
                "--directions, --categories"
            )
        doc: yamlfile.Document | None = None
        data: Any
        if options.get("file"):
            try:
                raw = Path(options["file"]).read_bytes()
            except OSError as exc:
                raise CommandError(f"cannot read {options['file']}: {exc.strerror}") from None
            doc, problems = yamlfile.read(raw, options["file"])
            if doc is not None and doc.data is None:
                problems.append(Problem((), f"{options['file']} is empty", "empty"))
            if doc is None or problems:
                raise CommandError(
                    "the guard refuses this policy; nothing was changed:\n"
                    + "\n".join(f"  {p.message}" for p in problems)
                )
            data = doc.data
            if flags and not isinstance(data, dict):
                flags = []  # the file's own shape is the problem reported
        else:
            data = policy_rules.to_data(services.current_policy())
        if flags:
            data = dict(data)
            judge = data.pop("judge", {})
            judge = dict(judge) if isinstance(judge, dict) else judge
            if options.get("judges") is not None and isinstance(judge, dict):
                data.pop("judge.models", None)
                judge["models"] = options["judges"]
            if options.get("controversial") is not None and isinstance(judge, dict):
                data.pop("judge.controversial", None)
                judge["controversial"] = options["controversial"]
            data["judge"] = judge
            if options.get("fail") is not None:
                data["fail"] = options["fail"]
            if options.get("directions") is not None:
                d = options["directions"]
                data["directions"] = [] if d == ["none"] else d
            if options.get("categories") is not None:
                data["categories"] = options["categories"]
        return data, doc

    # Evaluation

    def _eval(self, options: dict[str, Any]) -> None:
        try:
            loaded = evalrun.load_set(options.get("set"))
        except evalrun.SetRefused as exc:
            raise CommandError(
                f"the labelled set {exc.source} cannot be used:\n"
                + "\n".join(f"  {p.message}" for p in exc.problems)
            ) from None
        if not options["timeout"] > 0:
            raise CommandError("--timeout must be a positive number of seconds")
        names = options.get("judges") or evalrun.default_judges()
        if not options.get("judges"):
            names = [n for n in names if n in evalrun.guard_models()]
            if not names:
                raise CommandError(
                    "no judge to evaluate: none of the policy's judges is a guard model in "
                    "the catalog; enable one (guard judge enable) or name them with --judges"
                )
        try:
            names = evalrun.check_judges(names)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        labelled = loaded.labelled
        self.stdout.write(
            f"set {labelled.name} ({loaded.source}): {len(labelled.texts)} texts, "
            f"{labelled.count(ev.ORDINARY)} ordinary and {labelled.count(ev.HARMFUL)} harmful"
        )
        self.stdout.write(f"judges: {', '.join(names)}")

        def progress(judge: str, done: int, total: int) -> None:
            if done == total:
                self.stderr.write(f"  {judge}: {total} texts asked")

        # One INFO line per ask from httpx would bury the table: only its warnings.
        http_log = logging.getLogger("httpx")
        level = http_log.level
        http_log.setLevel(max(level, logging.WARNING))
        try:
            record = evalrun.run(
                loaded, names, surface=Surface.CLI, actor_name=_cli_name(),
                timeout=options["timeout"], progress=progress,
            )  # fmt: skip
        finally:
            http_log.setLevel(level)
        summaries, rows = evalrun.read_run(record)
        self._eval_texts(names, rows)
        self._eval_summary(summaries)
        self.stdout.write(f"kept as evaluation {record.pk} (the console's Guard page shows it)")

    def _eval_texts(self, names: list[str], rows: list[evalrun.TextRow]) -> None:
        self.stdout.write("")
        self.stdout.write(
            "unsafe score per text: P(unsafe) from the engine's logprobs (lp), else 1 or 0 "
            "from the verdict (v); * flagged; x no verdict (and why)"
        )
        widths = [max(len(n), 12) for n in names]
        head = f"{'#':>3}  {'label':<8}  " + "  ".join(
            f"{n:<{w}}" for n, w in zip(names, widths, strict=True)
        )
        self.stdout.write(head + "  text")
        for row in rows:
            cells = "  ".join(
                f"{_score_cell(r):<{w}}" for r, w in zip(row.results, widths, strict=True)
            )
            text = " ".join(row.text.split())
            if row.answer is not None:
                text += " → answer: " + " ".join(row.answer.split())
            text = text if len(text) <= 70 else text[:69] + "…"
            self.stdout.write(f"{row.position + 1:>3}  {row.label:<8}  {cells}  {text}")

    def _eval_summary(self, summaries: list[ev.Summary]) -> None:
        self.stdout.write("")
        width = max([len(s.judge) for s in summaries] + [5])
        self.stdout.write(
            f"{'judge':<{width}}  {'false positives':<22}  {'harmful caught':<22}  "
            f"{'failures':<18}  {'p50 ms':>8}  {'p95 ms':>8}  {'scores':<8}  "
            "max ordinary / min harmful"
        )
        for s in summaries:
            fp = f"{ev.percent(s.false_positive_rate)} ({s.false_positives}/{s.ordinary_answered})"
            caught = f"{ev.percent(s.catch_rate)} ({s.caught}/{s.harmful_answered})"
            failures = str(s.failures)
            if s.failures_by_kind:
                failures += (
                    " (" + ", ".join(f"{k} {n}" for k, n in s.failures_by_kind.items()) + ")"
                )
            self.stdout.write(
                f"{s.judge:<{width}}  {fp:<22}  {caught:<22}  {failures:<18}  "
                f"{_ms(s.latency_p50):>8}  {_ms(s.latency_p95):>8}  {s.score_source or '—':<8}  "
                f"{_num(s.ordinary_max_score)} / {_num(s.harmful_min_score)}"
            )


def _no_abbreviations(parser: argparse.ArgumentParser) -> None:
    """Refuse abbreviated options on a parser and every subcommand's parser."""
    parser.allow_abbrev = False
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _no_abbreviations(sub)


def _score_cell(result: Any) -> str:
    if result is None:
        return "—"
    if not result.verdict:
        return f"x {result.failure_kind}"
    mark = "*" if result.flagged else ""
    source = "lp" if result.score_source == ev.FROM_LOGPROBS else "v"
    return f"{result.score:.2f}{mark} {source}"


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}"


def _num(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def _engine_key_at(url: str) -> str:
    """Return the engine key of the replica reached at ``url`` (its endpoint, with or
    without ``/v1``), or "" for an engine the cluster does not run."""
    base = url.rstrip("/").removesuffix("/v1")
    rid = Replica.objects.filter(endpoint__in=(base, base + "/")).values_list("id", flat=True)
    found = rid.first()
    return engine_key(found) if found else ""


def _judge_arguments(sub: Any) -> None:
    """The known judges: list, enable, use."""
    judge = sub.add_parser("judge", help="the known judges")
    jsub = judge.add_subparsers(dest="judge_action", required=True)
    jsub.add_parser("list", help="known judges, and which the catalog and policy have")
    enable = jsub.add_parser("enable", help="add a known judge to the catalog and serve it")
    enable.add_argument("name", nargs="?", help="default: qwen3guard-0.6b (the 4B with --gpu)")
    enable.add_argument("--gpu", action="store_true", help="on the GPU class with the most memory")
    enable.add_argument("--sim", action="store_true", help="on the sim engine (tests, demos)")
    use = jsub.add_parser("use", help="set the policy's judges, in order")
    use.add_argument("names", nargs="+")


def _check_arguments(sub: Any) -> None:
    """Check: judge a text with the policy or one engine."""
    check = sub.add_parser(
        "check",
        help="judge a text with the policy (or, with --endpoint, one engine); print JSON",
    )
    check.add_argument("--request", required=True, metavar="TEXT")
    check.add_argument("--answer", metavar="TEXT")
    check.add_argument(
        "--endpoint",
        metavar="URL",
        help="ask this OpenAI-compatible engine directly, to try a judge before enabling "
        "it; decided as the policy would with it added",
    )
    check.add_argument(
        "--format", dest="judge_format", choices=list(formats.FORMATS),
        help="the engine's judge format (with --endpoint)",
    )  # fmt: skip
    check.add_argument("--model", metavar="NAME", help="the model name sent (vLLM checks it)")
    check.add_argument("--variant", help="the format's variant (llamaguard3: 1b or 8b)")
    check.add_argument(
        "--categories", nargs="+", metavar="CATEGORY", help="the judge's own category names"
    )
    check.add_argument(
        "--context-length", type=int, default=snapshots.DEFAULT_CONTEXT, metavar="N",
        help=f"the judge's context in tokens (default {snapshots.DEFAULT_CONTEXT}; lowered to "
        "what the engine reports)",
    )  # fmt: skip
    check.add_argument(
        "--timeout", type=float, default=30.0, help="seconds the ask may take (default 30)"
    )


def _prompt_arguments(sub: Any) -> None:
    """Prompt: the prompt a judge receives."""
    prompt = sub.add_parser("prompt", help="print exactly the prompt a judge receives")
    prompt.add_argument("--judge", required=True)
    request = prompt.add_mutually_exclusive_group(required=True)
    request.add_argument("--request", metavar="TEXT", help="the request to judge")
    request.add_argument("--request-file", metavar="F", help="a file holding the request")
    answer = prompt.add_mutually_exclusive_group()
    answer.add_argument("--answer", metavar="TEXT", help="the answer to judge")
    answer.add_argument("--answer-file", metavar="G", help="a file holding the answer")


def _policy_arguments(sub: Any) -> None:
    """Policy: show or set."""
    policy = sub.add_parser("policy", help="show or set the policy (checked, logged)")
    psub = policy.add_subparsers(dest="policy_action", required=True)
    psub.add_parser("show", help="print the policy in force as JSON (what --file reads)")
    pset = psub.add_parser(
        "set", help="set the policy from a file and/or flags; flags change only their key"
    )
    pset.add_argument("--file", help="a policy as YAML or JSON (keys left out: the baseline's)")
    pset.add_argument("--judges", nargs="+", metavar="NAME", help="judge.models, in order")
    pset.add_argument("--controversial", metavar="safe|unsafe", help="judge.controversial")
    pset.add_argument("--fail", metavar="open|closed", help="when every judge failed")
    pset.add_argument(
        "--directions", nargs="+", metavar="DIRECTION", help="requests, answers, or none"
    )
    pset.add_argument(
        "--categories", nargs="*", metavar="CATEGORY", help="the categories that refuse"
    )


def _eval_arguments(sub: Any) -> None:
    """Eval: a labelled set through judges."""
    evaluate = sub.add_parser(
        "eval", help="run a labelled set through judges; print and keep the figures"
    )
    evaluate.add_argument(
        "--judges",
        nargs="+",
        metavar="NAME",
        help="default: the policy's judges, then known judges with a ready replica",
    )
    evaluate.add_argument(
        "--set",
        dest="set",
        metavar="NAME_OR_FILE",
        help=f"a packaged set ({', '.join(evalrun.packaged_sets())}) or a YAML file; "
        f"default {evalrun.DEFAULT_SET}",
    )
    evaluate.add_argument(
        "--timeout", type=float, default=30.0, help="seconds one ask may take (default 30)"
    )
