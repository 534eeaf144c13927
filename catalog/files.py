"""Catalog files: YAML with one key, ``models:``, read strictly and written stably.

Reading turns the text into plain data with a small composer of its own, fed by PyYAML's
event parser (libyaml's when available), rather than ``yaml.safe_load``, because:

1. PyYAML silently keeps the last of two equal keys; an operator who wrote ``tp`` twice
   must be told. Duplicates are reported with their path and line.
2. Scalars are resolved as YAML 1.2 (and the reference's yaml.v3) resolve them: ``22:00``,
   ``yes`` and ``2024-01-01`` are text, not a number, a boolean or a date, so a file
   written for the reference reads the same here.
3. libyaml's composer recurses on the C stack and crashes on deeply nested input; this
   one keeps its own stack and refuses a document nested deeper than ``MAX_DEPTH``.
4. Anchors and aliases work, merge keys (``<<: *defaults``) too, but the values reached
   through aliases are counted and capped, so a small file cannot expand to billions.

Every model is then decoded by ``catalog.codec.decode_model``; every problem in the file
is reported, and a file with any problem yields no models (import is all or nothing).

Writing puts the keys in declaration order, quotes every string some YAML reader would
take for something else, and is byte-stable: ``dump(load(dump(x))) == dump(x)``.
"""

from __future__ import annotations

import difflib
import json
import re
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

from catalog.codec import decode_model, encode_model
from catalog.problems import PathPart, Problem, format_path
from catalog.spec import Model

MAX_FILE_BYTES = 10 * 1024 * 1024
# A catalog is nested about eight levels deep (models, a model, origin, previous, files,
# a file); anything far deeper is not a catalog.
MAX_DEPTH = 64
# Values reached through aliases, counted as often as they are reached. A catalog that
# shares one profile among a thousand models uses a few tens of thousands.
MAX_ALIAS_NODES = 1_000_000

_Parser: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_DumperBase: Any = getattr(yaml, "CSafeDumper", yaml.SafeDumper)

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

_MERGE = object()
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


def _resolve_plain(text: str) -> Any:
    """Return what an untagged, unquoted scalar means under YAML 1.2's core schema."""
    if text in _WORDS:
        return _WORDS[text]
    if text == "<<":
        return _MERGE
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
        # Past Python's limit on digits (4,300): no catalog number is that long, and
        # yaml.v3 would not read it as one either.
        return text
    if _FLOAT_RE.fullmatch(text):
        return float(text.replace("_", ""))
    if _INF_RE.fullmatch(text):
        return float("-inf") if text.startswith("-") else float("inf")
    if _NAN_RE.fullmatch(text):
        return float("nan")
    return text


def _core_tag(text: str) -> str:
    """Return the tag YAML 1.2's core schema gives an unquoted scalar."""
    value = _resolve_plain(text)
    if value is _MERGE:
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


class _Abort(Exception):
    """Stop reading: the problem that says why has been recorded."""


class _Frame:
    """A mapping or sequence being composed."""

    __slots__ = ("is_map", "anchor", "value", "path", "key", "key_event", "merges")

    def __init__(self, is_map: bool, path: tuple[PathPart, ...], anchor: str | None) -> None:
        self.is_map = is_map
        self.anchor = anchor
        self.value: Any = {} if is_map else []
        self.path = path
        self.key: Any = _NO_KEY
        self.key_event: Any = None
        self.merges: list[tuple[Any, Any]] = []


def _line(event: Any) -> int:
    """Return the 1-based line an event starts on."""
    return int(event.start_mark.line) + 1


def _short(text: str, limit: int = 40) -> str:
    """Return text quoted for a message, shortened."""
    return json.dumps(text if len(text) <= limit else text[: limit - 1] + "…", ensure_ascii=False)


def _where(path: tuple[PathPart, ...]) -> str:
    """Return where a path is, for a message: ``in models[0]``, ``at the top``."""
    return f"in {format_path(path)}" if path else "at the top of the file"


class _Composer:
    """Build plain data from parser events, noting duplicates and refusing bombs."""

    def __init__(self) -> None:
        self.problems: list[tuple[tuple[PathPart, ...], str, str]] = []
        self.stack: list[_Frame] = []
        self.anchors: dict[str, tuple[Any, int]] = {}
        self.root: Any = _NOTHING
        self.expanded = 0
        self.documents = 0
        # Sizes of anchored values by id; the anchors dict keeps them alive.
        self.sizes: dict[int, int] = {}

    def add(self, path: tuple[PathPart, ...], code: str, message: str) -> None:
        """Record a problem at a path from the top of the file."""
        self.problems.append((path, code, message))

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
        if key is _MERGE:
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
                if event.tag is None:
                    value = event.value
                    if not event.implicit[0]:
                        pass
                    elif value in words:
                        value = words[value]
                    elif value[0] in number_start:
                        value = _resolve_number(value)
                    elif value == "<<":
                        value = _MERGE
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
                if done.anchor is not None:
                    anchors[done.anchor] = (value, self.count(value))
            elif kind is MappingStartEvent or kind is SequenceStartEvent:
                frame = self.start(event, kind is MappingStartEvent)
                continue
            elif kind is AliasEvent:
                value = self.alias(event)
            elif kind is DocumentStartEvent:
                self.document(event)
                continue
            elif kind is StreamEndEvent:
                return
            else:
                continue
            if frame is None:
                self.root = "<<" if value is _MERGE else value
            elif not frame.is_map:
                frame.value.append("<<" if value is _MERGE else value)
            elif frame.key is _NO_KEY:
                if value.__class__ is str:
                    frame.key = value
                    frame.key_event = event
                else:
                    self.take_key(frame, value, event)
            else:
                key = frame.key
                frame.key = _NO_KEY
                if key.__class__ is str and value is not _MERGE:
                    mapping = frame.value
                    if key in mapping:
                        self.duplicate(frame, key)
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
                f"the file holds more than one YAML document (a second starts at "
                f'line {_line(event)}): keep one, with "models:" at its top',
            )
            raise _Abort

    def start(self, event: Any, is_map: bool) -> _Frame:
        """Open a mapping or sequence."""
        if len(self.stack) >= MAX_DEPTH:
            self.add(
                (),
                "unsupported_yaml",
                f"the file is nested more than {MAX_DEPTH} levels deep at line "
                f"{_line(event)}; a catalog is nested far less",
            )
            raise _Abort
        tag = event.tag
        if tag is not None and tag != "!" and tag != (_MAP if is_map else _SEQ):
            self.unsupported_tag(tag, event)
        frame = _Frame(is_map, self.here(), event.anchor)
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
                f"the file's aliases expand to more than {MAX_ALIAS_NODES:,} values "
                f"(at *{event.anchor}, line {_line(event)}): write the shared parts "
                "out, or use fewer aliases",
            )
            raise _Abort
        return value

    def take_key(self, frame: _Frame, value: Any, event: Any) -> None:
        """Note a key that is not plain text (a number, null, ``<<`` or a block)."""
        frame.key_event = event
        if isinstance(value, dict | list):
            self.add(
                frame.path,
                "wrong_type",
                f"a key {_where(frame.path)} (line {_line(event)}) is "
                f"{'a mapping' if isinstance(value, dict) else 'a list'}: keys must "
                "be text",
            )
            frame.key = _BAD_KEY
            return
        frame.key = value

    def put_odd(self, frame: _Frame, key: Any, value: Any) -> None:
        """Put a value whose key is not plain text, or that is ``<<`` itself."""
        if value is _MERGE:
            value = "<<"
        if key is _BAD_KEY:
            return
        if key is _MERGE:
            if frame.merges:
                self.duplicate(frame, "<<")
            frame.merges.append((value, frame.key_event))
            return
        if key in frame.value:
            self.duplicate(frame, key)
        frame.value[key] = value

    def duplicate(self, frame: _Frame, key: Any) -> None:
        """Record a key written twice in one mapping."""
        name = key if isinstance(key, str) else str(key)
        self.add(
            (*frame.path, name),
            "duplicate_key",
            f'"{name}" is written twice {_where(frame.path)} (again at line '
            f"{_line(frame.key_event)}): YAML would keep only the last, so remove one",
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
                f"{_short(text)} at line {_line(event)} is not a valid !!{tag.removeprefix(_TAG)}",
            )
            return text
        self.unsupported_tag(tag, event)
        return text

    def unsupported_tag(self, tag: str, event: Any) -> None:
        """Record a tag a catalog cannot hold (a date, binary data, a custom type)."""
        shown = "!!" + tag.removeprefix(_TAG) if tag.startswith(_TAG) else tag
        self.add(
            self.here(),
            "unsupported_yaml",
            f"the tag {shown} at line {_line(event)} is not supported: a catalog holds "
            "only text, numbers, true/false, lists and mappings",
        )


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
        if len(text_or_bytes) > MAX_FILE_BYTES:
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
    if len(raw) > MAX_FILE_BYTES:
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
        f"{MAX_FILE_BYTES // 1024 // 1024} MB ({MAX_FILE_BYTES:,} bytes): split the "
        "catalog into smaller files",
        code="too_large",
    )


def _top_problems(data: Any, source_name: str) -> list[Problem]:
    """Return the problems with the file's top level: a mapping holding ``models``."""
    if data is _NOTHING or data is None:
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
    raw = _to_bytes(text_or_bytes, source_name)
    if isinstance(raw, Problem):
        return None, [raw]
    composer = _Composer()
    try:
        data = composer.compose(raw)
    except yaml.YAMLError as e:
        return None, [_yaml_problem(e, raw, source_name)]
    except _Abort:
        return None, _placed(composer.problems, None)
    problems = _top_problems(data, source_name)
    items = data.get("models") if isinstance(data, dict) else None
    items = items if isinstance(items, list) else None
    found = _placed(composer.problems, items)
    problems += [p for p in found if p.index is None]
    by_index: dict[int, list[Problem]] = {}
    for p in found:
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


def _placed(
    found: list[tuple[tuple[PathPart, ...], str, str]], items: list[Any] | None
) -> list[Problem]:
    """Return composer problems, those inside a model relative to it with its index."""
    out = []
    for path, code, message in found:
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
                    message=message,
                    code=code,
                    model=name if isinstance(name, str) else "",
                    index=path[1],
                )
            )
        else:
            out.append(Problem(path=path, message=message, code=code))
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
            tag = _core_tag(value)
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
