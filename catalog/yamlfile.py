"""The one YAML reader of llmgw: every file it reads (catalogs, guard policies, evaluation sets).

Plain Python over PyYAML's event parser (libyaml's when available), no Django. ``read``
returns the document as plain data (mappings, lists, text, numbers, booleans, null) with
the line each value starts on, and every problem found, each saying where (the file, the
line, the path) and what to do. It is not ``yaml.safe_load``, because:

1. PyYAML silently keeps the last of two equal keys; an operator who wrote ``tp`` twice
   must be told. Each duplicate is reported with its path and both lines.
2. Plain scalars are resolved as YAML 1.2's core schema resolves them, widened to the
   numbers the reference's yaml.v3 also reads (``resolve_plain``): ``22:00``, ``yes``,
   ``no``, ``on``, ``off`` and ``2024-01-01`` are text; ``1_000``, ``0b101``, ``0o17``,
   ``0x1f`` and ``0X1F`` are whole numbers; ``.inf``/``.nan`` floats; ``~``, ``null`` and
   nothing are null; ``true``/``false`` (any case of the first letter, or all capitals)
   booleans. A file written for the reference reads the same here.
3. libyaml's composer recurses on the C stack and crashes on deeply nested input; this one
   keeps its own stack and refuses a document nested deeper than ``MAX_DEPTH``.
4. Anchors and aliases work, merge keys (``<<: *defaults``) too, but the values reached
   through aliases are counted and capped (``MAX_ALIAS_NODES``), so a small file cannot
   expand to billions.
5. Keys are text: a key that is a number, a boolean, null, a list or a mapping is refused
   (quote it). Only the core schema's tags are read (``!!str``, ``!!int``, ``!!float``,
   ``!!bool``, ``!!null``, ``!!map``, ``!!seq``); any other (``!!binary``, ``!!python/…``)
   is refused. One document, UTF-8 (a byte-order mark is allowed), at most ``MAX_BYTES``.

A problem that leaves nothing to read (too large, not UTF-8, not YAML, too deep, an alias
bomb, a second document) stops the reading: ``read`` returns no document. The others
(a duplicate key, a refused key or tag) are all reported with the document, so a caller
can report its own problems beside them; a caller accepts a file only when there are none.

``read_mapping`` reads a file whose top is a mapping of known keys (a labelled set of the
guard's evaluations, an eval suite of the updates): the empty file, a top that is not a
mapping and each unknown key are reported the same way for every such file.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Sequence
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
    StreamEndEvent,
)
from yaml.reader import ReaderError

from catalog.problems import PathPart, Problem, format_path

# A catalog of a thousand models with their origin files runs to a few megabytes.
MAX_BYTES = 10 * 1024 * 1024
# The deepest file llmgw reads, a catalog, is nested eight levels deep (the top, models, a
# model, origin, previous, one of them, files, a file); twice that is refused.
MAX_DEPTH = 16
# Values reached through aliases, counted as often as they are reached. A catalog that
# shares one profile among a thousand models uses a few tens of thousands.
MAX_ALIAS_NODES = 1_000_000

_Parser: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

_TAG = "tag:yaml.org,2002:"
_STR = _TAG + "str"
_INT = _TAG + "int"
_FLOAT = _TAG + "float"
_BOOL = _TAG + "bool"
_NULL = _TAG + "null"
_MAP = _TAG + "map"
_SEQ = _TAG + "seq"
_MERGE_TAG = _TAG + "merge"

# Plain scalars that YAML 1.2's core schema (and yaml.v3) reads as something other than
# text: these words, and numbers. Anything else is text.
_WORDS: dict[str, Any] = {
    "": None,
    "~": None,
    "null": None,
    "Null": None,
    "NULL": None,
    "true": True,
    "True": True,
    "TRUE": True,
    "false": False,
    "False": False,
    "FALSE": False,
}
_NUMBER_START = frozenset("-+.0123456789")
_INT_RE = re.compile(
    r"[-+]?(?:0[xX]_*[0-9a-fA-F][0-9a-fA-F_]*|0[oO]_*[0-7][0-7_]*"
    r"|0[bB]_*[01][01_]*|[0-9][0-9_]*)"
)
_FLOAT_RE = re.compile(r"[-+]?(?:\.[0-9][0-9_]*|[0-9][0-9_]*(?:\.[0-9_]*)?)(?:[eE][-+]?[0-9]+)?")
_INF_RE = re.compile(r"[-+]?\.(?:inf|Inf|INF)")
_NAN_RE = re.compile(r"\.(?:nan|NaN|NAN)")

MERGE = object()
"""What ``resolve_plain`` returns for ``<<``, the merge key."""

_NO_KEY = object()
_BAD_KEY = object()
_NOTHING = object()


def _to_int(text: str) -> int:
    """Return the value of an integer literal matched by ``_INT_RE``."""
    body = text.replace("_", "")
    sign = -1 if body.startswith("-") else 1
    body = body.lstrip("+-")
    prefix = body[:2].lower()
    if prefix == "0x":
        return sign * int(body[2:], 16)
    if prefix == "0o":
        return sign * int(body[2:], 8)
    if prefix == "0b":
        return sign * int(body[2:], 2)
    return sign * int(body, 10)


def resolve_plain(text: str) -> Any:
    """Return what an untagged, unquoted scalar means here (see the module's docstring)."""
    if text in _WORDS:
        return _WORDS[text]
    if text == "<<":
        return MERGE
    if text[0] in _NUMBER_START:
        return _resolve_number(text)
    return text


def _resolve_number(text: str) -> Any:
    """Return the number a plain scalar starting like one stands for, or the text."""
    try:
        if text.isascii() and text.isdigit():
            return int(text)
        if _INT_RE.fullmatch(text):
            return _to_int(text)
    except ValueError:
        # Past Python's limit on digits (4,300): no number llmgw reads is that long, and
        # yaml.v3 would not read it as one either.
        return text
    if _FLOAT_RE.fullmatch(text):
        return float(text.replace("_", ""))
    if _INF_RE.fullmatch(text):
        return float("-inf") if text.startswith("-") else float("inf")
    if _NAN_RE.fullmatch(text):
        return float("nan")
    return text


def core_tag(text: str) -> str:
    """Return the tag ``read`` gives an unquoted scalar (for writers deciding on quotes)."""
    value = resolve_plain(text)
    if value is MERGE:
        return _MERGE_TAG
    if value is None:
        return _NULL
    if isinstance(value, bool):
        return _BOOL
    if isinstance(value, int):
        return _INT
    if isinstance(value, float):
        return _FLOAT
    return _STR


def where(path: tuple[PathPart, ...], line: int | None) -> str:
    """Return ``texts[3].label (line 14)`` for messages."""
    at = format_path(path) or "the top of the file"
    return f"{at} (line {line})" if line else at


@dataclass
class Document:
    """A file's data (None for an empty file) and the line each value in it starts on."""

    data: Any
    root_line: int | None = None
    # By id of each mapping and list: its keys' (or items') lines, 1-based.
    lines: dict[int, Any] = field(default_factory=dict, repr=False)
    # The mappings and lists the ids above name, kept alive so no id is reused.
    keep: list[Any] = field(default_factory=list, repr=False)

    def line(self, path: tuple[PathPart, ...]) -> int | None:
        """Return the line a value starts on; for a path not in the file, its parent's.

        A value in a mapping starts where its key is written.
        """
        value, best = self.data, self.root_line
        for part in path:
            lines = self.lines.get(id(value))
            if lines is None:
                break
            try:
                at, value = lines[part], value[part]
            except (KeyError, IndexError, TypeError):
                break
            best = at
        return best


class _Abort(Exception):
    """Stop reading: the problem that says why has been recorded."""


class _Frame:
    """A mapping or sequence being composed."""

    __slots__ = (
        "is_map", "anchor", "value", "lines", "path", "line", "key", "key_event", "merges"
    )  # fmt: skip

    def __init__(
        self, is_map: bool, path: tuple[PathPart, ...], anchor: str | None, line: int
    ) -> None:
        self.is_map = is_map
        self.anchor = anchor
        self.value: Any = {} if is_map else []
        self.lines: Any = {} if is_map else []
        self.path = path
        self.line = line  # 0-based, as the parser counts
        self.key: Any = _NO_KEY
        self.key_event: Any = None
        self.merges: list[tuple[Any, Any]] = []


def _line(event: Any) -> int:
    """Return the 1-based line an event starts on."""
    return int(event.start_mark.line) + 1


def _short(text: str, limit: int = 40) -> str:
    """Return text quoted for a message, shortened."""
    return json.dumps(text if len(text) <= limit else text[: limit - 1] + "…", ensure_ascii=False)


def _in(path: tuple[PathPart, ...]) -> str:
    """Return where a path is, for a message: ``in models[0]``, ``at the top``."""
    return f"in {format_path(path)}" if path else "at the top of the file"


def _shown(value: Any) -> str:
    """Return what a refused key is, in words."""
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "null (empty)"
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    return f"the number {value!r}"


class _Composer:
    """Build plain data from parser events, noting duplicates and refusing bombs."""

    def __init__(self, source_name: str) -> None:
        self.source_name = source_name
        self.problems: list[Problem] = []
        self.stack: list[_Frame] = []
        self.anchors: dict[str, tuple[Any, int]] = {}
        self.root: Any = _NOTHING
        self.root_line: int | None = None
        self.expanded = 0
        self.documents = 0
        self.lines: dict[int, Any] = {}
        self.keep: list[Any] = []
        # Sizes of anchored values by id; the anchors dict keeps them alive.
        self.sizes: dict[int, int] = {}

    def add(self, path: tuple[PathPart, ...], code: str, message: str) -> None:
        """Record a problem at a path from the top of the file."""
        self.problems.append(Problem(path, message, code))

    def here(self) -> tuple[PathPart, ...]:
        """Return the path of the value being read."""
        if not self.stack:
            return ()
        frame = self.stack[-1]
        if not frame.is_map:
            return (*frame.path, len(frame.value))
        key = frame.key
        if key is _NO_KEY or key is _BAD_KEY:
            return frame.path
        if key is MERGE:
            return (*frame.path, "<<")
        return (*frame.path, key if isinstance(key, str) else str(key))

    def compose(self, source: bytes) -> Any:
        """Return the document's data, or _NOTHING when there is none.

        Raises _Abort after recording the problem that stops the reading, and lets
        yaml.YAMLError through for text that is not YAML.
        """
        loader = _Parser(source)
        try:
            self._run(loader)
        finally:
            loader.dispose()
        return self.root

    def _run(self, loader: Any) -> None:
        """Consume the events of one stream.

        The loop is written out flat, with the common cases (a text key, a plain
        scalar) handled inline, because it runs once per value of the file and
        dominates the time an import takes.
        """
        get_event = loader.get_event
        stack = self.stack
        anchors = self.anchors
        words = _WORDS
        number_start = _NUMBER_START
        frame: _Frame | None = None  # the top of the stack
        while True:
            event = get_event()
            kind = type(event)
            if kind is ScalarEvent:
                line = event.start_mark.line
                if event.tag is None:
                    value = event.value
                    if not event.implicit[0]:
                        pass
                    elif value in words:
                        value = words[value]
                    elif value[0] in number_start:
                        value = _resolve_number(value)
                    elif value == "<<":
                        value = MERGE
                else:
                    value = self.scalar(event)
                if event.anchor is not None:
                    anchors[event.anchor] = (value, 1)
            elif kind is MappingEndEvent or kind is SequenceEndEvent:
                done = stack.pop()
                frame = stack[-1] if stack else None
                if done.merges:
                    self.merge(done)
                value = done.value
                line = done.line
                self.lines[id(value)] = done.lines
                self.keep.append(value)
                if done.anchor is not None:
                    anchors[done.anchor] = (value, self.count(value))
            elif kind is MappingStartEvent or kind is SequenceStartEvent:
                frame = self.start(event, kind is MappingStartEvent)
                continue
            elif kind is AliasEvent:
                line = event.start_mark.line
                value = self.alias(event)
            elif kind is DocumentStartEvent:
                self.document(event)
                continue
            elif kind is StreamEndEvent:
                return
            else:
                continue
            if frame is None:
                self.root = "<<" if value is MERGE else value
                self.root_line = line + 1
            elif not frame.is_map:
                frame.value.append("<<" if value is MERGE else value)
                frame.lines.append(line + 1)
            elif frame.key is _NO_KEY:
                frame.key_event = event
                if value.__class__ is str:
                    frame.key = value
                else:
                    self.take_key(frame, value, event)
            else:
                key = frame.key
                frame.key = _NO_KEY
                if key.__class__ is str and value is not MERGE:
                    mapping = frame.value
                    if key in mapping:
                        self.duplicate(frame, key)
                    else:
                        frame.lines[key] = frame.key_event.start_mark.line + 1
                    mapping[key] = value
                else:
                    self.put_odd(frame, key, value)

    def count(self, value: Any) -> int:
        """Return how many values an anchored value holds, itself included.

        Values already counted (those of earlier anchors, reached through aliases)
        are looked up rather than walked again, so nested aliases cost nothing here.
        """
        if value.__class__ is not dict and value.__class__ is not list:
            return 1
        known = self.sizes.get(id(value))
        if known is not None:
            return known
        children = value.values() if value.__class__ is dict else value
        total = 1 + len(value) + sum(self.count(v) for v in children)
        self.sizes[id(value)] = total
        return total

    def document(self, event: Any) -> None:
        """Count a document; refuse a second one."""
        self.documents += 1
        if self.documents > 1:
            self.add(
                (),
                "not_yaml",
                f"{self.source_name} holds more than one YAML document (a second starts at "
                f"line {_line(event)}): keep one",
            )
            raise _Abort

    def start(self, event: Any, is_map: bool) -> _Frame:
        """Open a mapping or sequence."""
        if len(self.stack) >= MAX_DEPTH:
            self.add(
                (),
                "too_deep",
                f"{self.source_name} is nested more than {MAX_DEPTH} levels deep at line "
                f"{_line(event)}: no file llmgw reads is nested that deep; check the "
                "brackets and the indentation",
            )
            raise _Abort
        tag = event.tag
        if tag is not None and tag != "!" and tag != (_MAP if is_map else _SEQ):
            self.unsupported_tag(tag, event)
        frame = _Frame(is_map, self.here(), event.anchor, event.start_mark.line)
        self.stack.append(frame)
        return frame

    def alias(self, event: Any) -> Any:
        """Return the value an alias refers to, counting its size against the cap."""
        entry = self.anchors.get(event.anchor)
        if entry is None:
            self.add(
                self.here(),
                "not_yaml",
                f"*{event.anchor} at line {_line(event)} refers to no anchor "
                f"&{event.anchor} before it (or to a block it is itself inside)",
            )
            raise _Abort
        value, size = entry
        self.expanded += size
        if self.expanded > MAX_ALIAS_NODES:
            self.add(
                (),
                "too_large",
                f"{self.source_name}'s aliases expand to more than {MAX_ALIAS_NODES:,} values "
                f"(at *{event.anchor}, line {_line(event)}): write the shared parts "
                "out, or use fewer aliases",
            )
            raise _Abort
        return value

    def take_key(self, frame: _Frame, value: Any, event: Any) -> None:
        """Note a key that is not plain text: ``<<``, or refused (a number, null, a block)."""
        if value is MERGE:
            frame.key = MERGE
            return
        self.add(
            frame.path,
            "wrong_type",
            f"a key {_in(frame.path)} (line {_line(event)}) is {_shown(value)}: keys must "
            "be text" + ("" if isinstance(value, dict | list) else " (quote it)"),
        )
        frame.key = _BAD_KEY

    def put_odd(self, frame: _Frame, key: Any, value: Any) -> None:
        """Put a value whose key is ``<<``, or refused, or that is ``<<`` itself."""
        if value is MERGE:
            value = "<<"
        if key is _BAD_KEY:
            return
        if key is MERGE:
            if frame.merges:
                self.duplicate(frame, "<<")
            frame.merges.append((value, frame.key_event))
            return
        # A text key whose value is "<<".
        if key in frame.value:
            self.duplicate(frame, key)
        else:
            frame.lines[key] = _line(frame.key_event)
        frame.value[key] = value

    def duplicate(self, frame: _Frame, key: str) -> None:
        """Record a key written twice in one mapping."""
        first = frame.lines.get(key)
        if key == "<<" and frame.merges:
            first = _line(frame.merges[0][1])
        lines = f"lines {first} and {_line(frame.key_event)}"
        self.add(
            (*frame.path, key),
            "duplicate_key",
            f'"{key}" is written twice {_in(frame.path)} ({lines}): YAML would keep only '
            "the last, so remove one",
        )

    def merge(self, frame: _Frame) -> None:
        """Fill in the keys a ``<<`` merge brings that the mapping does not set."""
        for source, event in frame.merges:
            sources = source if isinstance(source, list) else [source]
            for item in sources:
                if not isinstance(item, dict):
                    self.add(
                        (*frame.path, "<<"),
                        "not_yaml",
                        f"<< at line {_line(event)} must be given a mapping (like "
                        "*defaults) or a list of them",
                    )
                    continue
                for key, value in item.items():
                    if key not in frame.value:
                        frame.value[key] = value
                        frame.lines[key] = _line(event)

    def scalar(self, event: Any) -> Any:
        """Return the value of an explicitly tagged scalar."""
        tag = event.tag
        text = event.value
        if tag == "!" or tag == _STR:
            return text
        if tag == _NULL:
            return None
        if tag == _BOOL and text.lower() in ("true", "false"):
            return text.lower() == "true"
        number = _resolve_number(text) if text[:1] in _NUMBER_START else text
        if tag == _INT and isinstance(number, int):
            return number
        if tag == _FLOAT and isinstance(number, int | float):
            return float(number)
        if tag in (_BOOL, _INT, _FLOAT):
            self.add(
                self.here(),
                "not_yaml",
                f"{_short(text)} at line {_line(event)} is not a valid "
                f"!!{tag.removeprefix(_TAG)}: write it as one, or drop the tag",
            )
            return text
        self.unsupported_tag(tag, event)
        return text

    def unsupported_tag(self, tag: str, event: Any) -> None:
        """Record a tag no file of llmgw holds (a date, binary data, a custom type)."""
        shown = "!!" + tag.removeprefix(_TAG) if tag.startswith(_TAG) else tag
        self.add(
            self.here(),
            "unsupported_yaml",
            f"the tag {shown} at line {_line(event)} is not supported: these files hold "
            "only text, numbers, true/false, null, lists and mappings; remove the tag",
        )


def read(source: str | bytes, source_name: str = "<file>") -> tuple[Document | None, list[Problem]]:
    """Read a file: its document and every problem in it (paths from the top of the file).

    The document is None when a problem leaves nothing to read; its data is None for an
    empty file (nothing, a comment, ``---`` or ``null``). Accept the file only when the
    list of problems is empty.
    """
    raw = _to_bytes(source, source_name)
    if isinstance(raw, Problem):
        return None, [raw]
    composer = _Composer(source_name)
    try:
        data = composer.compose(raw)
    except yaml.YAMLError as e:
        return None, [_yaml_problem(e, raw, source_name)]
    except _Abort:
        return None, composer.problems
    if data is _NOTHING:
        data = None
    return Document(data, composer.root_line, composer.lines, composer.keep), composer.problems


def _yaml_problem(err: yaml.YAMLError, source: bytes, source_name: str) -> Problem:
    """Return the problem for text the parser refused."""
    mark = getattr(err, "problem_mark", None)
    if isinstance(err, ReaderError):
        line = source.count(b"\n", 0, err.position) + 1
        reason = f"line {line}: {err.reason} (character 0x{err.character:02x})"
    elif mark is not None:
        reason = f"line {mark.line + 1}, column {mark.column + 1}: {err.problem}"
        if getattr(err, "context", None):
            reason += f" ({err.context})"
    else:
        reason = str(err)
    return Problem(path=(), message=f"{source_name} is not valid YAML: {reason}", code="not_yaml")


def _to_bytes(text_or_bytes: str | bytes, source_name: str) -> bytes | Problem:
    """Return the file as UTF-8 bytes without a byte-order mark, or the problem."""
    if isinstance(text_or_bytes, str):
        if len(text_or_bytes) > MAX_BYTES:
            return _too_large(len(text_or_bytes), source_name)
        try:
            raw = text_or_bytes.encode("utf-8")
        except UnicodeEncodeError as e:
            return Problem(
                path=(),
                message=f"{source_name} holds a character that is not valid Unicode "
                f"at position {e.start}: save the file as UTF-8",
                code="not_utf8",
            )
    else:
        raw = bytes(text_or_bytes)
    if len(raw) > MAX_BYTES:
        return _too_large(len(raw), source_name)
    raw = raw.removeprefix(b"\xef\xbb\xbf")
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        return Problem(
            path=(),
            message=f"{source_name} is not UTF-8 text: the byte 0x{raw[e.start]:02x} "
            f"on line {line} (offset {e.start}) is not valid UTF-8; save the file "
            "as UTF-8",
            code="not_utf8",
        )
    return raw


def _too_large(size: int, source_name: str) -> Problem:
    """Return the problem for a file over the size limit."""
    return Problem(
        path=(),
        message=f"{source_name} is {size:,} bytes; the limit is "
        f"{MAX_BYTES // 1024 // 1024} MB ({MAX_BYTES:,} bytes): split it into smaller files",
        code="too_large",
    )


def describe_kind(value: Any) -> str:
    """Return what a value of a file is, in words for a problem's message."""
    if value is None:
        return "empty (null)"
    if isinstance(value, bool):
        return f"{str(value).lower()} (a boolean)"
    if isinstance(value, int | float):
        return f"{value} (a number)"
    if isinstance(value, str):
        return "text"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return type(value).__name__


@dataclass
class MappingFile:
    """A file whose top is a mapping of known keys, as ``read_mapping`` read it.

    ``data`` is the mapping, or None when the file is not one (``problems`` says why);
    ``add`` records a further problem at a path, with where it is written.
    """

    source_name: str
    document: Document | None
    problems: list[Problem]
    prefix: str = ""

    @property
    def data(self) -> dict[str, Any] | None:
        if self.document is None or not isinstance(self.document.data, dict):
            return None
        return self.document.data

    def line(self, path: tuple[PathPart, ...]) -> int | None:
        """Return the line a value starts on (None when the file was not read)."""
        return self.document.line(path) if self.document is not None else None

    def add(self, path: tuple[PathPart, ...], code: str, message: str) -> None:
        """Record a problem at a path: ``<prefix>texts[3].label (line 14): <message>``."""
        at = where(path, self.line(path))
        self.problems.append(Problem(path, f"{self.prefix}{at}: {message}", code))

    def check_keys(
        self, mapping: dict[str, Any], path: tuple[PathPart, ...], keys: Sequence[str], what: str
    ) -> bool:
        """Record each key of ``mapping`` not in ``keys``, with the one it may be meant as;
        ``what`` names the mapping (``a set``, ``a case``). Return whether all are known."""
        known = True
        for key in mapping:
            if key in keys:
                continue
            known = False
            close = difflib.get_close_matches(key, keys, n=1)
            hint = f'did you mean "{close[0]}"? ' if close else ""
            self.add(
                (*path, key),
                "unknown_key",
                f'unknown key "{key}": {what} has {", ".join(keys)}; {hint}rename it, or remove it',
            )
        return known


def read_mapping(
    source: str | bytes,
    source_name: str,
    *,
    what: str,
    keys: Sequence[str],
    prefix: str = "",
) -> MappingFile:
    """Read a file whose top is a mapping with ``keys`` (``what`` names it: ``a set``).

    Every problem says where (``prefix``, the path and the line) and what to do: one the
    reader found, an empty file, a top that is not a mapping, each unknown key. The
    caller checks the values and adds its own problems; it accepts the file only when
    ``problems`` is empty.
    """
    doc, problems = read(source, source_name)
    found = MappingFile(source_name, doc, list(problems), prefix)
    if doc is None:
        return found
    if doc.data is None:
        found.problems.append(
            Problem((), f"{source_name} is empty: write its {', '.join(keys)}", "empty")
        )
        return found
    if not isinstance(doc.data, dict):
        found.add(
            (),
            "not_mapping",
            f"{what} is a mapping with {', '.join(keys)}, not {describe_kind(doc.data)}",
        )
        return found
    found.check_keys(doc.data, (), keys, what)
    return found
