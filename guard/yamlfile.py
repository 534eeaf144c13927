"""Read a small YAML (or JSON) file strictly: the guard's evaluation sets and policy files.

Plain Python over PyYAML's event parser, no Django. ``read`` returns the document as plain
data (mappings, lists, text, numbers, booleans, null) and the line each value starts on,
or the problems that stop it being read, each saying where and what to do:

- a key written twice in one mapping (PyYAML would silently keep the last);
- scalars resolved as YAML 1.2's core schema resolves them, so ``no``, ``on`` and
  ``22:00`` are text, as an operator typing a request means them;
- no aliases (``*name``: a small file cannot expand to a large one), no tags other than
  the plain ones, one document, nesting at most ``MAX_DEPTH`` deep;
- UTF-8 only (a byte-order mark is allowed), at most ``MAX_BYTES``.

The catalog's files have a reader of their own (``catalog.files``) with anchors, merge
keys and a catalog's messages; these files are small and flat and want lines in every
message.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import yaml
from yaml.events import (
    AliasEvent,
    DocumentStartEvent,
    MappingEndEvent,
    MappingStartEvent,
    ScalarEvent,
    SequenceEndEvent,
    SequenceStartEvent,
)
from yaml.reader import ReaderError

from catalog.problems import PathPart, Problem, format_path

MAX_BYTES = 2 * 1024 * 1024
MAX_DEPTH = 16

_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

_TAG = "tag:yaml.org,2002:"
_PLAIN_TAGS = {"!", _TAG + "str", _TAG + "map", _TAG + "seq"}

_NULLS = {"", "~", "null", "Null", "NULL"}
_BOOLS = {"true": True, "True": True, "TRUE": True, "false": False, "False": False, "FALSE": False}
_INT_RE = re.compile(r"[-+]?[0-9]+")
_OCT_RE = re.compile(r"0o[0-7]+")
_HEX_RE = re.compile(r"0x[0-9a-fA-F]+")
_FLOAT_RE = re.compile(r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?")
_INF_RE = re.compile(r"[-+]?\.(?:inf|Inf|INF)")
_NAN_RE = re.compile(r"\.(?:nan|NaN|NAN)")


def resolve_plain(text: str) -> Any:
    """Return what an unquoted scalar means under YAML 1.2's core schema."""
    if text in _NULLS:
        return None
    if text in _BOOLS:
        return _BOOLS[text]
    try:
        if _INT_RE.fullmatch(text):
            return int(text)
        if _OCT_RE.fullmatch(text):
            return int(text[2:], 8)
        if _HEX_RE.fullmatch(text):
            return int(text[2:], 16)
    except ValueError:  # past Python's limit on digits: no such number is meant
        return text
    if _FLOAT_RE.fullmatch(text):
        return float(text)
    if _INF_RE.fullmatch(text):
        return float("-inf") if text.startswith("-") else float("inf")
    if _NAN_RE.fullmatch(text):
        return float("nan")
    return text


@dataclass
class Document:
    """A file's data and the line (1-based) each value in it starts on, by path."""

    data: Any
    lines: dict[tuple[PathPart, ...], int] = field(default_factory=dict)

    def line(self, path: tuple[PathPart, ...]) -> int | None:
        """Return the line a value starts on; for a path not in the file, its parent's."""
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return self.lines.get(())


class _Stop(Exception):
    """Reading stops here; the problem that says why has been recorded."""


def where(path: tuple[PathPart, ...], line: int | None) -> str:
    """Return ``texts[3].label (line 14)`` for messages."""
    at = format_path(path) or "the top of the file"
    return f"{at} (line {line})" if line else at


def read(source: str | bytes, source_name: str = "<file>") -> tuple[Document | None, list[Problem]]:
    """Return a file's data, or None and the problems that stop it being read."""
    raw, problem = _to_text(source, source_name)
    if problem is not None:
        return None, [problem]
    problems: list[Problem] = []
    lines: dict[tuple[PathPart, ...], int] = {}
    # Each open container: [value, path, pending key or None, key's line].
    stack: list[list[Any]] = []
    root: Any = None
    documents = 0

    def add(path: tuple[PathPart, ...], code: str, message: str) -> None:
        problems.append(Problem(path, message, code))

    def place(value: Any, line: int) -> tuple[PathPart, ...] | None:
        """Put a value where the open container wants it; return its path."""
        nonlocal root
        if not stack:
            root = value
            lines[()] = line
            return ()
        top = stack[-1]
        container, path = top[0], top[1]
        if isinstance(container, list):
            here = (*path, len(container))
            container.append(value)
            lines[here] = line
            return here
        if top[2] is None:
            # A key: it must be text.
            if isinstance(value, dict | list) or not isinstance(value, str):
                shown = "a mapping" if isinstance(value, dict) else "a list"
                if not isinstance(value, dict | list):
                    shown = f"{value!r}"
                add(
                    path,
                    "bad_key",
                    f"{where(path, line)}: a key is {shown}; keys are text (quote it)",
                )
                raise _Stop
            if value in container:
                first = lines.get((*path, value))
                add(
                    (*path, value),
                    "duplicate_key",
                    f'{where((*path, value), first)}: "{value}" is written twice (lines {first} and '
                    f"{line}); YAML would keep only the last, so remove one",
                )
            top[2], top[3] = value, line
            return None
        key = top[2]
        top[2] = None
        here = (*path, key)
        if key not in container:
            container[key] = value
        lines[here] = line
        return here

    try:
        for event in yaml.parse(raw, Loader=_Loader):
            line = event.start_mark.line + 1
            if isinstance(event, DocumentStartEvent):
                documents += 1
                if documents > 1:
                    add(
                        (),
                        "not_yaml",
                        f"{source_name} holds a second document at line {line}: keep one",
                    )
                    raise _Stop
                continue
            if isinstance(event, AliasEvent):
                add(
                    (),
                    "alias",
                    f"{source_name} line {line}: *{event.anchor} is an alias; write the value out "
                    "(aliases are not read here)",
                )
                raise _Stop
            tag = getattr(event, "tag", None)
            if isinstance(event, ScalarEvent):
                if tag is not None and tag not in _PLAIN_TAGS:
                    add(
                        (),
                        "unsupported_yaml",
                        f"{source_name} line {line}: the tag {tag} is not supported",
                    )
                    raise _Stop
                plain = event.implicit[0] and tag is None
                value = resolve_plain(event.value) if plain else event.value
                place(value, line)
            elif isinstance(event, MappingStartEvent | SequenceStartEvent):
                if tag is not None and tag not in _PLAIN_TAGS:
                    add(
                        (),
                        "unsupported_yaml",
                        f"{source_name} line {line}: the tag {tag} is not supported",
                    )
                    raise _Stop
                if len(stack) >= MAX_DEPTH:
                    add(
                        (),
                        "too_deep",
                        f"{source_name} is nested more than {MAX_DEPTH} levels deep at line {line}",
                    )
                    raise _Stop
                value = {} if isinstance(event, MappingStartEvent) else []
                path = place(value, line)
                # A container as a key was refused in place(); path is None only for keys.
                stack.append([value, path if path is not None else (), None, 0])
            elif isinstance(event, MappingEndEvent | SequenceEndEvent):
                stack.pop()
    except _Stop:
        return None, problems
    except yaml.YAMLError as err:
        return None, [_yaml_problem(err, raw, source_name)]
    if documents == 0 or root is None:
        return None, [Problem((), f"{source_name} is empty", "empty")]
    if problems:
        return None, problems
    return Document(root, lines), []


def _to_text(source: str | bytes, source_name: str) -> tuple[str, Problem | None]:
    """Return the file as text, or the problem with its size or encoding."""
    if isinstance(source, str):
        size = len(source.encode("utf-8", "surrogatepass"))
        text = source
    else:
        size = len(source)
        raw = bytes(source).removeprefix(b"\xef\xbb\xbf")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            line = raw.count(b"\n", 0, e.start) + 1
            return "", Problem(
                (),
                f"{source_name} is not UTF-8: the byte 0x{raw[e.start]:02x} on line {line} "
                "is not valid UTF-8; save the file as UTF-8",
                "not_utf8",
            )
    if size > MAX_BYTES:
        return "", Problem(
            (),
            f"{source_name} is {size:,} bytes; the limit is {MAX_BYTES:,}: split it",
            "too_large",
        )
    text = text.removeprefix("\ufeff")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return "", Problem(
            (),
            f"{source_name} holds a character that is not valid Unicode at position {e.start}",
            "not_utf8",
        )
    return text, None


def _yaml_problem(err: yaml.YAMLError, text: str, source_name: str) -> Problem:
    """Return the problem for text the parser refused, with its line and column."""
    mark = getattr(err, "problem_mark", None)
    if isinstance(err, ReaderError):
        line = text.count("\n", 0, err.position) + 1
        reason = f"line {line}: {err.reason}"
    elif mark is not None:
        reason = f"line {mark.line + 1}, column {mark.column + 1}: {err.problem}"
        if getattr(err, "context", None):
            reason += f" ({err.context})"
    else:
        reason = str(err)
    return Problem((), f"{source_name} is not valid YAML: {reason}", "not_yaml")
