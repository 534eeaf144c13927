"""Catalog files from the command line: validate, import and export.

    manage.py catalog validate FILE          exit 0 if valid, else 1 and one line a problem
    manage.py catalog import FILE [--dry-run] [--replace]
    manage.py catalog export [FILE]
    manage.py catalog update check [MODEL ...] [--json]   (and the rest of the updates app's
                                                             group, catalog.extensions)

A stable interface (architecture.md): scripts and CI depend on the exit codes and lines.
"""

from __future__ import annotations

import getpass
import socket
import sys
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from catalog import extensions, files, rules, services
from catalog.choices import Surface
from catalog.problems import Problem


def _read(path: str) -> tuple[Any, list[Problem]]:
    if path == "-":
        data = sys.stdin.buffer.read(files.MAX_FILE_BYTES + 1)
    else:
        p = Path(path)
        if not p.is_file():
            return None, [Problem((), f"{path}: no such file", "no_file")]
        if p.stat().st_size > files.MAX_FILE_BYTES:
            return files.load_catalog_text(b"x" * (files.MAX_FILE_BYTES + 1), path)
        data = p.read_bytes()
    return files.load_catalog_text(data, path)


class Command(BaseCommand):
    help = "Validate, import or export a catalog file."

    def add_arguments(self, parser: Any) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        validate = sub.add_parser("validate", help="check a file; exit 1 with one line a problem")
        validate.add_argument("file", help="a catalog YAML file, or - for standard input")
        imp = sub.add_parser("import", help="import a file all at once")
        imp.add_argument("file")
        imp.add_argument(
            "--dry-run", action="store_true", help="say what would change; write nothing"
        )
        imp.add_argument(
            "--replace", action="store_true", help="also remove models the file does not list"
        )
        exp = sub.add_parser("export", help="write the catalog as a file (standard output if none)")
        exp.add_argument("file", nargs="?")
        # Subcommands the layers above register (catalog.extensions): `update` is the
        # updates app's.
        for name, extra in sorted(extensions.SUBCOMMANDS.items()):
            extra.add_arguments(sub.add_parser(name, help=extra.help))

    def _fail(self, problems: list[Problem]) -> None:
        for p in problems:
            self.stderr.write(p.line())
        raise SystemExit(1)

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        if action in extensions.SUBCOMMANDS:
            extensions.SUBCOMMANDS[action].handle(self, options)
            return
        if action == "export":
            text = files.dump_catalog(services.export_specs())
            if options["file"]:
                Path(options["file"]).write_text(text, encoding="utf-8")
            else:
                self.stdout.write(text, ending="")
            return
        models, problems = _read(options["file"])
        if problems or models is None:
            self._fail(problems)
        if action == "validate":
            problems = rules.check_catalog(models, services.environment())
            if problems:
                self._fail(problems)
            for w in rules.catalog_warnings(models):
                self.stdout.write(f"warning: {w.line()}")
            self.stdout.write(f"{options['file']}: {len(models)} models, valid")
            return
        actor = services.Actor(
            user=None,
            surface=Surface.FILE,
            via=Path(options["file"]).name,
            name=f"{getpass.getuser()}@{socket.gethostname()}",
        )
        try:
            result = services.import_catalog(
                models, actor, replace=options["replace"], dry_run=options["dry_run"]
            )
        except services.Refused as exc:
            self._fail(exc.problems)

        for w in rules.catalog_warnings(models):
            self.stdout.write(f"warning: {w.line()}")
        prefix = "would be " if options["dry_run"] else ""
        for label, names in (
            ("added", result.added),
            ("changed", result.changed),
            ("removed", result.removed),
        ):
            for name in names:
                self.stdout.write(f"{prefix}{label}: {name}")
        self.stdout.write(
            f"{prefix}added {len(result.added)}, changed {len(result.changed)}, "
            f"removed {len(result.removed)}, unchanged {len(result.unchanged)}"
        )


__all__ = ("Command", "CommandError")
