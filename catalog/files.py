"""Catalog files: YAML with one key, ``models:``, read strictly and written stably.

Reading is llmgw's one YAML reader (``catalog.yamlfile``: duplicate keys reported, YAML
1.2's scalars as the reference's yaml.v3 reads them, depth, size and alias expansion
capped). Every model is then decoded by ``catalog.codec.decode_model``; every problem in
the file is reported, and a file with any problem yields no models (import is all or
nothing).

Writing puts the keys in declaration order, quotes every string some YAML reader would
take for something else, and is byte-stable: ``dump(load(dump(x))) == dump(x)``.
"""

from __future__ import annotations

import difflib
import re
from typing import Any

import yaml

from catalog import yamlfile
from catalog.codec import decode_model, encode_model
from catalog.problems import Problem
from catalog.spec import Model

_DumperBase: Any = getattr(yaml, "CSafeDumper", yaml.SafeDumper)

# The reader's limit, under the name the catalog's commands and tests know.
MAX_FILE_BYTES = yamlfile.MAX_BYTES

_TAG = "tag:yaml.org,2002:"
_STR = _TAG + "str"

# Text that a YAML 1.1 reader or a person would take for a time, a date or a number
# (``08:00``, ``1:30``, ``2024-01-01``); always quoted when written.
_LOOKS_TYPED = re.compile(
    r"[-+]?[0-9][0-9_]*(?::[0-9_]+)+(?:\.[0-9_]*)?"
    r"|[0-9]{4}-[0-9]{1,2}-[0-9]{1,2}(?:[Tt ].*)?"
    r"|[-+]?[0-9._]*[eE][-+]?[0-9]*"
    r"|[-+]?0[0-9_]+(?:\.[0-9_]*)?"
    r"|[yYnN]"
)

# The first characters of every plain scalar YAML 1.1 or 1.2 reads as other than text.
_TYPED_START = frozenset("-+.0123456789~nNtTfFyYoO<=")


def _top_problems(data: Any, source_name: str) -> list[Problem]:
    """Return the problems with the file's top level: a mapping holding ``models``."""
    if data is None:
        return [
            Problem(
                path=(),
                message=f'{source_name} is empty: put the models under "models:", as a list',
                code="no_models",
            )
        ]
    if not isinstance(data, dict):
        hint = ""
        if isinstance(data, list):
            hint = ': write "models:" on the first line and indent the list under it'
        what = "a list" if isinstance(data, list) else "a single value"
        return [
            Problem(
                path=(),
                message=f"the top of {source_name} must be a mapping with the key "
                f'"models:", not {what}{hint}',
                code="not_mapping",
            )
        ]
    problems = []
    if "models" not in data:
        problems.append(
            Problem(
                path=(),
                message=f'{source_name} has no "models:" key: put the models under '
                '"models:", as a list',
                code="no_models",
            )
        )
    for key in data:
        if key == "models":
            continue
        text = key if isinstance(key, str) else str(key)
        close = difflib.get_close_matches(text.strip().lower(), ["models"], n=1)
        hint = 'did you mean "models"?' if close else 'a catalog file has only "models:" at its top'
        problems.append(
            Problem(
                path=(text,),
                message=f'unknown key "{text}" at the top of the file: {hint}',
                code="unknown_key",
            )
        )
    models = data.get("models")
    if models is not None and not isinstance(models, list):
        problems.append(
            Problem(
                path=("models",),
                message='"models" must be a list of models, one "- " item each, '
                f"not {'a mapping' if isinstance(models, dict) else 'a single value'}",
                code="wrong_type",
            )
        )
    return problems


def load_catalog_text(
    text_or_bytes: str | bytes, source_name: str = "<file>"
) -> tuple[list[Model] | None, list[Problem]]:
    """Read a catalog file; return its models, or None with every problem in it.

    ``source_name`` names the file in messages about the whole file. Problems inside a
    model have its path from the model, its index in ``models`` and its name.
    """
    doc, found = yamlfile.read(text_or_bytes, source_name)
    if doc is None:
        return None, _placed(found, None)
    data = doc.data
    problems = _top_problems(data, source_name)
    items = data.get("models") if isinstance(data, dict) else None
    items = items if isinstance(items, list) else None
    placed = _placed(found, items)
    problems += [p for p in placed if p.index is None]
    by_index: dict[int, list[Problem]] = {}
    for p in placed:
        if p.index is not None:
            by_index.setdefault(p.index, []).append(p)
    models: list[Model] = []
    for i, item in enumerate(items or []):
        problems += by_index.get(i, [])
        model, model_problems = decode_model(item, index=i)
        problems += model_problems
        if model is not None:
            models.append(model)
    if problems:
        return None, problems
    return models, []


def _placed(found: list[Problem], items: list[Any] | None) -> list[Problem]:
    """Return the reader's problems, those inside a model relative to it with its index."""
    out = []
    for p in found:
        path = p.path
        if (
            items is not None
            and len(path) >= 2
            and path[0] == "models"
            and isinstance(path[1], int)
            and path[1] < len(items)
        ):
            item = items[path[1]]
            name = item.get("name") if isinstance(item, dict) else None
            out.append(
                Problem(
                    path=path[2:],
                    message=p.message,
                    code=p.code,
                    model=name if isinstance(name, str) else "",
                    index=path[1],
                )
            )
        else:
            out.append(p)
    return out


class _Dumper(_DumperBase):  # type: ignore[misc, valid-type]
    """Write plain data as a catalog file: block style, no aliases, safe quoting."""

    def ignore_aliases(self, data: Any) -> bool:
        """Write every value out; an export never uses anchors."""
        return True

    def resolve(self, kind: Any, value: Any, implicit: Any) -> Any:
        """Return a non-text tag for any text that some reader would not read as text.

        The emitter quotes a string exactly when its plain form resolves to another
        tag, so this decides what gets quoted: what YAML 1.2 or YAML 1.1 (PyYAML, older
        tools) would read as a number, boolean, null or date, and clock times.
        """
        if kind is yaml.ScalarNode and implicit[0]:
            if value and value[0] not in _TYPED_START:
                return _STR
            tag = yamlfile.core_tag(value)
            if tag == _STR:
                tag = super().resolve(kind, value, implicit)
            if tag == _STR and _LOOKS_TYPED.fullmatch(value):
                tag = _TAG + "timestamp"
            return tag
        return super().resolve(kind, value, implicit)


def _represent_str(dumper: Any, data: str) -> Any:
    """Write multi-line text as a literal block, which reads as it was typed."""
    if "\n" in data and not _ODD_BREAKS.search(data):
        return dumper.represent_scalar(_STR, data, style="|")
    return dumper.represent_scalar(_STR, data)


# A literal block turns these into plain newlines on reading; text holding them is
# written double-quoted with escapes instead.
_ODD_BREAKS = re.compile("[\r\x85\u2028\u2029]")

_Dumper.add_representer(str, _represent_str)

# Wide enough that no line is ever folded: folding is where YAML writers and readers
# disagree about spaces.
_WIDTH = 2**31 - 1


def dump_catalog(models: list[Model]) -> str:
    """Return the text of a catalog file holding these models."""
    data = {"models": [encode_model(m) for m in models]}
    text: str = yaml.dump(
        data,
        Dumper=_Dumper,
        sort_keys=False,
        allow_unicode=True,
        default_flow_style=False,
        width=_WIDTH,
        indent=2,
    )
    return text
