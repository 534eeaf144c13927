"""Convert catalog dataclasses to and from plain data (what YAML or JSON gives).

Decoding is strict about shape, because a typo in a catalog file must not be silently
ignored: an unknown key, a value of the wrong type or a duration without a unit is a
``Problem`` naming the key, where it is and what to write instead. Every problem in the
input is reported, not only the first. Rules about values (ranges, names, one field
against another) are not checked here; ``catalog.rules`` does that on the decoded model.

Encoding writes the keys in declaration order and leaves out empty values the way the
reference's ``omitempty`` json tags do, so exports read like the files operators write.

Both directions are generic: they walk the dataclasses' fields and type hints, so a field
added to ``catalog.spec`` is read and written without a change here.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import re
import types
import typing
from collections.abc import Callable
from functools import cache
from typing import Any, TypeVar

from catalog import spec
from catalog.durations import DurationError, format_duration, parse_duration
from catalog.problems import PathPart, Problem, format_path
from catalog.spec import Model, key_of

T = TypeVar("T")

# Fields the reference writes even when empty: their json tags have no omitempty. A
# consumer of an export (the Go tools, the API's clients) may rely on them being present.
_ALWAYS_WRITTEN: dict[type, frozenset[str]] = {
    spec.ScaleWindow: frozenset({"from_", "to", "min"}),
    spec.External: frozenset({"url", "model"}),
    spec.Canary: frozenset({"model", "percent"}),
    spec.EvalGate: frozenset({"suite"}),
    spec.GuardModel: frozenset({"format"}),
    spec.Origin: frozenset({"repo", "revision"}),
    spec.OriginFile: frozenset({"path"}),
    spec.PreviousOrigin: frozenset({"source", "revision"}),
    spec.Adapter: frozenset({"name", "source"}),
}

# Integral floats are written as whole numbers (as Go writes a float64 300 as 300), but
# only where the whole number reads back as exactly the same float.
_MAX_EXACT_FLOAT_INT = 1e15


@dataclasses.dataclass(frozen=True)
class _Shape:
    """What a field holds: a scalar kind, a list or dict of shapes, or a nested block."""

    kind: str  # str, int, float, bool, duration, list, dict, struct
    item: _Shape | None = None
    cls: type | None = None
    optional: bool = False


@dataclasses.dataclass(frozen=True)
class _Field:
    """One dataclass field as the codec sees it."""

    attr: str
    key: str
    shape: _Shape
    always: bool
    # The one Python type that is already a valid value as it is (str for text, int for
    # whole numbers); lets the decoder skip its general path for most values.
    exact: type | None = None
    # A scalar's default when it is not empty (cached_token_weight's 1): the field is
    # written when its value differs from it (0 included), else left out.
    default: Any = None


def _shape_of(tp: Any, duration: bool) -> _Shape:
    """Return the shape of a resolved type hint; refuse a type the files cannot hold."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) != 1 or len(args) != 2:
            raise TypeError(f"unsupported union {tp!r}: only X | None is")
        inner = _shape_of(rest[0], duration)
        if inner.kind != "struct":
            raise TypeError(f"unsupported optional {tp!r}: only blocks may be None")
        return dataclasses.replace(inner, optional=True)
    if origin is list:
        return _Shape("list", item=_shape_of(args[0], False))
    if origin is dict:
        if args[0] is not str:
            raise TypeError(f"unsupported mapping {tp!r}: keys must be str")
        return _Shape("dict", item=_shape_of(args[1], False))
    if tp is bool:
        return _Shape("bool")
    if tp is int:
        return _Shape("duration" if duration else "int")
    if tp is float:
        return _Shape("float")
    if tp is str:
        return _Shape("str")
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _Shape("struct", cls=tp)
    raise TypeError(f"unsupported field type {tp!r}")


@cache
def _fields(cls: type) -> tuple[_Field, ...]:
    """Return the codec's view of a dataclass's fields, in declaration order."""
    hints = typing.get_type_hints(cls)
    always = _ALWAYS_WRITTEN.get(cls, frozenset())
    out = []
    for f in dataclasses.fields(cls):
        shape = _shape_of(hints[f.name], f.metadata.get("kind") == "duration")
        exact = {"str": str, "int": int, "bool": bool}.get(shape.kind)
        default = f.default if f.default is not dataclasses.MISSING and f.default else None
        out.append(_Field(f.name, key_of(f), shape, f.name in always, exact, default))
    return tuple(out)


@cache
def _by_key(cls: type) -> dict[str, _Field]:
    """Return a dataclass's fields by file key."""
    return {f.key: f for f in _fields(cls)}


@cache
def _places(root: type) -> dict[str, tuple[str, ...]]:
    """Return, for every key under ``root``, where it may be written (``profiles[]``).

    Used to tell an operator who put a key at the wrong level where it belongs.
    """
    found: dict[str, list[str]] = {}

    def walk(cls: type, where: str, seen: frozenset[type]) -> None:
        for f in _fields(cls):
            found.setdefault(f.key, [])
            if where not in found[f.key]:
                found[f.key].append(where)
            shape = f.shape.item if f.shape.kind == "list" else f.shape
            if shape is not None and shape.kind == "struct" and shape.cls not in seen:
                assert shape.cls is not None
                sub = f.key + ("[]" if f.shape.kind == "list" else "")
                walk(shape.cls, f"{where}.{sub}" if where else sub, seen | {shape.cls})

    walk(root, "", frozenset({root}))
    return {k: tuple(v) for k, v in found.items()}


def _quote(text: str, limit: int = 60) -> str:
    """Return text in double quotes, shortened, for a message."""
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return json.dumps(text, ensure_ascii=False)


def _describe(value: Any) -> str:
    """Return what a value is, in words an operator recognises from the file."""
    if value is None:
        return "an empty value"
    if isinstance(value, bool):
        return f"the yes/no value {'true' if value else 'false'}"
    if isinstance(value, int | float):
        try:
            return f"the number {value!r}"
        except ValueError:  # an int past Python's limit on digits
            return "a number too long to show"
    if isinstance(value, str):
        return f"the text {_quote(value)}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return f"a {type(value).__name__}"


_NUMERIC = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")


def _looks_numeric(text: str) -> bool:
    """Return whether text is a plain number someone put in quotes."""
    return _NUMERIC.fullmatch(text.strip()) is not None


_BOOL_WORDS = {"true", "false", "yes", "no", "on", "off", "y", "n"}


class _Decoder:
    """Build dataclasses from plain data, collecting every problem on the way."""

    def __init__(self, root: type) -> None:
        self.root = root
        self.problems: list[Problem] = []

    def add(self, path: tuple[PathPart, ...], code: str, message: str) -> None:
        """Record one problem."""
        self.problems.append(Problem(path=path, message=message, code=code))

    def wrong(
        self,
        path: tuple[PathPart, ...],
        label: str,
        expected: str,
        data: Any,
        hint: str = "",
    ) -> None:
        """Record a value of the wrong type."""
        message = f"{label} must be {expected}, not {_describe(data)}"
        if data is None and not hint:
            hint = "write a value or leave the key out"
        self.add(path, "wrong_type", f"{message}: {hint}" if hint else message)

    def struct(self, cls: type, data: Any, path: tuple[PathPart, ...], label: str) -> Any:
        """Decode a mapping into ``cls``; return _FAIL when it is not a mapping."""
        by_key = _by_key(cls)
        if not isinstance(data, dict):
            keys = ", ".join(list(by_key)[:3])
            hint = ""
            if isinstance(data, list):
                hint = 'write its keys directly under it, without "- " in front'
            self.wrong(path, label, f"a mapping with keys like {keys}", data, hint)
            return _FAIL
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            f = by_key.get(key) if isinstance(key, str) else None
            if f is None:
                self.unknown(cls, key, path)
                continue
            if value.__class__ is f.exact and not (f.exact is str and "\x00" in value):
                kwargs[f.attr] = value
                continue
            decoded = self.value(f.shape, value, (*path, key), f.key)
            if decoded is not _FAIL:
                kwargs[f.attr] = decoded
        return cls(**kwargs)

    def unknown(self, cls: type, key: Any, path: tuple[PathPart, ...]) -> None:
        """Record an unknown key, with the key meant or the keys allowed."""
        keys = list(_by_key(cls))
        where = f"in {format_path(path)}" if path else "at the top"
        if not path and self.root is Model:
            where = "in the model"
        name = _quote(key) if isinstance(key, str) else repr(key)
        message = f"unknown key {name} {where}"
        text = key if isinstance(key, str) else str(key)
        top = "at the top of the model" if self.root is Model else "at the top"
        elsewhere = [f"in {p}" if p else top for p in _places(self.root).get(text, ())]
        close = difflib.get_close_matches(
            text.strip().lower().replace("-", "_").replace(" ", "_"),
            keys,
            n=1,
            cutoff=0.6,
        )
        if elsewhere:
            message += f": {text} belongs {' or '.join(elsewhere[:3])}, not here"
        elif close:
            message += f": did you mean {_quote(close[0])}?"
        else:
            message += f"; the keys here are {', '.join(keys)}"
        self.add((*path, text), "unknown_key", message)

    def value(self, shape: _Shape, data: Any, path: tuple[PathPart, ...], label: str) -> Any:
        """Decode one value of the given shape; return _FAIL after a problem."""
        return _DECODERS[shape.kind](self, shape, data, path, label)

    def d_str(self, shape: _Shape, data: Any, path: tuple, label: str) -> Any:
        """Decode text (without NUL characters, which no database column can hold)."""
        if isinstance(data, str):
            if "\x00" in data:
                self.add(
                    path,
                    "nul_character",
                    f"{label} contains a NUL character (\\0), which cannot be stored: remove it",
                )
                return _FAIL
            return data
        hint = ""
        if isinstance(data, bool):
            hint = f'put it in quotes ("{str(data).lower()}") if it is meant as text'
        elif isinstance(data, int):
            hint = f'put it in quotes ("{data}")'
        elif isinstance(data, float):
            hint = "put it in quotes, as it is written"
        self.wrong(path, label, "text", data, hint)
        return _FAIL

    def d_int(self, shape: _Shape, data: Any, path: tuple, label: str) -> Any:
        """Decode a whole number (a yes/no value or 2.0 is not one)."""
        if isinstance(data, int) and not isinstance(data, bool):
            return data
        hint = ""
        if isinstance(data, float) and math.isfinite(data) and data.is_integer():
            hint = f"write {int(data)}"
        elif isinstance(data, str) and re.fullmatch(r"[-+]?[0-9]{1,18}", data.strip()):
            hint = "leave out the quotes"
        self.wrong(path, label, "a whole number", data, hint)
        return _FAIL

    def d_float(self, shape: _Shape, data: Any, path: tuple, label: str) -> Any:
        """Decode a number; a whole number is one too."""
        if isinstance(data, int | float) and not isinstance(data, bool):
            try:
                value = float(data)
            except OverflowError:
                self.wrong(path, label, "a number of a usable size", data)
                return _FAIL
            if math.isfinite(value):
                return value
            self.wrong(path, label, "a finite number", data)
            return _FAIL
        hint = "leave out the quotes" if isinstance(data, str) else ""
        if hint and not _looks_numeric(data):
            hint = ""
        self.wrong(path, label, "a number", data, hint)
        return _FAIL

    def d_bool(self, shape: _Shape, data: Any, path: tuple, label: str) -> Any:
        """Decode true or false."""
        if isinstance(data, bool):
            return data
        hint = ""
        if isinstance(data, str) and data.strip().lower() in _BOOL_WORDS:
            hint = "write true or false, without quotes"
        self.wrong(path, label, "true or false", data, hint)
        return _FAIL

    def d_duration(self, shape: _Shape, data: Any, path: tuple, label: str) -> Any:
        """Decode a Go duration string; a bare number needs a unit."""
        number: Any = None
        if isinstance(data, int | float) and not isinstance(data, bool):
            if data == 0:
                return 0
            number = data
        elif isinstance(data, str):
            try:
                return parse_duration(data)
            except DurationError:
                if not _looks_numeric(data):
                    self.add(
                        path,
                        "bad_duration",
                        f"{label} is not a duration: {_quote(data)}; write a number "
                        "and a unit (ns, us, ms, s, m, h), like 90s, 20m or 1h30m",
                    )
                    return _FAIL
                number = data.strip()
        else:
            self.wrong(path, label, "a duration like 90s or 20m", data)
            return _FAIL
        self.add(
            path,
            "duration_unit",
            f"{label} needs a unit: write {number}s, {number}m or {number}h, not just {number}",
        )
        return _FAIL

    def d_list(self, shape: _Shape, data: Any, path: tuple, label: str) -> Any:
        """Decode a list; null is an empty one."""
        if data is None:
            return []
        if not isinstance(data, list):
            assert shape.item is not None
            hint = ""
            if isinstance(data, dict):
                hint = 'put "- " before its first key to make it an item of a list'
            elif isinstance(data, str | int | float):
                hint = 'write it as a list, one "- " line per item or like [a, b]'
            self.wrong(path, label, "a list", data, hint)
            return _FAIL
        item = shape.item
        assert item is not None
        if item.kind == "str" and all(e.__class__ is str and "\x00" not in e for e in data):
            return list(data)
        out = []
        ok = True
        for i, element in enumerate(data):
            decoded = self.value(item, element, (*path, i), f"{label}[{i}]")
            if decoded is _FAIL:
                ok = False
            else:
                out.append(decoded)
        return out if ok else _FAIL

    def d_dict(self, shape: _Shape, data: Any, path: tuple, label: str) -> Any:
        """Decode a mapping of text keys; null is an empty one."""
        if data is None:
            return {}
        if not isinstance(data, dict):
            self.wrong(path, label, "a mapping of names to values", data)
            return _FAIL
        item = shape.item
        assert item is not None
        out = {}
        ok = True
        for key, element in data.items():
            if isinstance(key, str) and "\x00" in key:
                self.add(
                    (*path,),
                    "nul_character",
                    f"a name in {label} contains a NUL character: remove it",
                )
                ok = False
                continue
            if not isinstance(key, str):
                self.wrong(
                    (*path, str(key)),
                    f"each name in {label}",
                    "text",
                    key,
                    f'put it in quotes ("{key}")' if key is not None else "",
                )
                ok = False
                continue
            decoded = self.value(item, element, (*path, key), f"{label}.{key}")
            if decoded is _FAIL:
                ok = False
            else:
                out[key] = decoded
        return out if ok else _FAIL

    def d_struct(self, shape: _Shape, data: Any, path: tuple, label: str) -> Any:
        """Decode a nested block; null is an absent optional block or an empty one."""
        assert shape.cls is not None
        if data is None:
            return None if shape.optional else shape.cls()
        return self.struct(shape.cls, data, path, label)


_FAIL = object()

_DECODERS: dict[str, Callable[[_Decoder, _Shape, Any, tuple, str], Any]] = {
    "str": _Decoder.d_str,
    "int": _Decoder.d_int,
    "float": _Decoder.d_float,
    "bool": _Decoder.d_bool,
    "duration": _Decoder.d_duration,
    "list": _Decoder.d_list,
    "dict": _Decoder.d_dict,
    "struct": _Decoder.d_struct,
}


def decode(
    cls: type[T], data: Any, path: tuple[PathPart, ...] = ()
) -> tuple[T | None, list[Problem]]:
    """Build a ``cls`` from plain data, strictly; return it or None with every problem.

    ``path`` is where ``data`` sits (``("profiles", 0)``), so the problems' paths and
    messages name the right place. Null for the whole value is an empty ``cls``.
    """
    decoder = _Decoder(cls)
    label = format_path(path) or cls.__name__.lower()
    value = decoder.struct(cls, {} if data is None else data, path, label)
    if decoder.problems or value is _FAIL:
        return None, decoder.problems
    return value, []


def decode_model(data: Any, index: int | None = None) -> tuple[Model | None, list[Problem]]:
    """Build a ``Model`` from plain data; return it or None with every problem.

    ``index`` is the model's position in its file or list; it and the model's name (when
    the data has a readable one) are set on every problem.
    """
    decoder = _Decoder(Model)
    value = decoder.struct(Model, data, (), "a model")
    name = ""
    if isinstance(data, dict) and isinstance(data.get("name"), str):
        name = data["name"]
    problems = [dataclasses.replace(p, model=name, index=index) for p in decoder.problems]
    if problems or value is _FAIL:
        return None, problems
    return value, []


def _encode_value(shape: _Shape, value: Any) -> Any:
    """Return the plain-data form of one value."""
    kind = shape.kind
    if value is None:
        return None
    if kind == "duration":
        return format_duration(value)
    if kind == "float":
        value = float(value)  # code may have set a whole number
        if value.is_integer() and abs(value) < _MAX_EXACT_FLOAT_INT:
            return int(value)
        return value
    if kind == "list":
        assert shape.item is not None
        return [_encode_value(shape.item, v) for v in value]
    if kind == "dict":
        assert shape.item is not None
        return {k: _encode_value(shape.item, value[k]) for k in sorted(value)}
    if kind == "struct":
        return encode(value)
    return value


def encode(obj: Any) -> dict[str, Any]:
    """Return a catalog dataclass as plain data, keys in declaration order.

    Empty values are left out as the reference's ``omitempty`` leaves them out, except
    the fields it always writes; an optional block that is present is always written.
    """
    out: dict[str, Any] = {}
    for f in _fields(type(obj)):
        value = getattr(obj, f.attr)
        if f.shape.kind == "struct" and value is not None:
            data = encode(value)
            # A block that is there is written even when empty, so it stays there; a
            # block that is always there (scaling, slo) is left out when empty.
            if data or f.shape.optional or f.always:
                out[f.key] = data
        elif f.always or (value if f.default is None else value != f.default):
            out[f.key] = _encode_value(f.shape, value)
    return out


def encode_model(m: Model) -> dict[str, Any]:
    """Return a model as plain data, as a catalog file or the API writes it."""
    return encode(m)
