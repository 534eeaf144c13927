"""A profile's fingerprint: a hash of its contents as the reference's Go JSON writes them."""

from __future__ import annotations

import hashlib
import math
import re
from decimal import Decimal

from catalog.spec import Profile


def fingerprint(p: Profile) -> str:
    """Return an id of a profile's contents: the first 8 bytes of a sha256, in hex.

    The name is not enough: a profile can be edited and keep its name. The hash is over
    exactly what the reference's ``json.Marshal`` of its Profile writes (field order,
    omitempty, sorted map keys, Go's float and string encoding), so the two agree on
    which replicas run an outdated definition. A profile with a NaN or infinite number
    cannot be rendered, and is ``"unmarshalable"``: never matching is better than
    calling two differing profiles the same.
    """
    try:
        data = _go_profile_json(p)
    except ValueError:
        return "unmarshalable"
    return hashlib.sha256(data.encode()).hexdigest()[:16]


def _go_profile_json(p: Profile) -> str:
    fields: list[tuple[str, str]] = []

    def text(key: str, v: str) -> None:
        if v:
            fields.append((key, _go_string(v)))

    def integer(key: str, v: int) -> None:
        if v:
            fields.append((key, str(int(v))))

    def number(key: str, v: float) -> None:
        if v != 0:  # NaN too: Go's omitempty keeps it, and it fails below
            fields.append((key, _go_float(float(v))))

    def mapping(key: str, v: dict[str, str]) -> None:
        if v:
            items = (f"{_go_string(k)}:{_go_string(v[k])}" for k in sorted(v))
            fields.append((key, "{" + ",".join(items) + "}"))

    text("name", p.name)
    text("engine", p.engine)
    text("engine_version", p.engine_version)
    text("gpu_class", p.gpu_class)
    integer("tp", p.tp)
    integer("pp", p.pp)
    integer("gpus_per_node", p.gpus_per_node)
    integer("nodes", p.nodes)
    if p.args:
        fields.append(("args", "[" + ",".join(_go_string(a) for a in p.args) + "]"))
    mapping("env", p.env)
    integer("min_memory_gb", p.min_memory_gb)
    integer("cpu_cores", p.cpu_cores)
    integer("min_disk_gb", p.min_disk_gb)
    mapping("node_selector", p.node_selector)
    number("power_watts", p.power_watts)
    text("keep_within", p.keep_within)
    number("weight", p.weight)
    integer("priority", p.priority)
    integer("startup_timeout", p.startup_timeout)
    if p.kv_events:
        fields.append(("kv_events", "true"))
    return "{" + ",".join(f'"{k}":{v}' for k, v in fields) + "}"


# Go's encoder escapes these (HTML-safe by default); other control characters become
# \u00XX, and text that is not valid UTF-8 (here, a lone surrogate) becomes \ufffd.
_GO_ESCAPES = {
    "\\": "\\\\",
    '"': '\\"',
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "<": "\\u003c",
    ">": "\\u003e",
    "&": "\\u0026",
    "\u2028": "\\u2028",
    "\u2029": "\\u2029",
}
_GO_ESCAPED = re.compile(r'[\\"<>&\u2028\u2029\x00-\x1f\ud800-\udfff]')


def _go_escape(m: re.Match[str]) -> str:
    ch = m.group()
    if ch in _GO_ESCAPES:
        return _GO_ESCAPES[ch]
    if ch < " ":
        return f"\\u{ord(ch):04x}"
    return "\\ufffd"


def _go_string(s: str) -> str:
    return '"' + _GO_ESCAPED.sub(_go_escape, s) + '"'


def _go_float(f: float) -> str:
    """Return a float64 as Go's encoding/json writes it: shortest digits, 1 not 1.0."""
    if not math.isfinite(f):
        raise ValueError(f"{f} has no JSON form")
    if f == 0:
        return "-0" if math.copysign(1, f) < 0 else "0"
    d = Decimal(repr(f)).normalize()
    if 1e-6 <= abs(f) < 1e21:
        return format(d, "f")
    sign, digits, exp = d.as_tuple()
    assert isinstance(exp, int)  # finite, checked above
    mantissa = "".join(map(str, digits))
    e = exp + len(mantissa) - 1
    if len(mantissa) > 1:
        mantissa = mantissa[0] + "." + mantissa[1:]
    return f"{'-' if sign else ''}{mantissa}e{'-' if e < 0 else '+'}{abs(e)}"
