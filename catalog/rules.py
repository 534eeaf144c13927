"""The catalog's rules: defaults, per-model checks, whole-catalog checks and helpers.

Plain Python on the dataclasses of ``catalog.spec``, with no Django import, so a whole
catalog file can be checked before anything touches the database. ``Model.clean()``,
the forms, the admin, the API serializers and the file import all call these functions
and never re-implement them.

A port of the reference's ``catalog`` package (``shared/seed/catalog.go.txt``).
Where the reference stops at its first error, ``check_model`` and ``check_catalog``
report every problem, except where one problem makes the checks after it meaningless
(a profile whose engine is unknown is not checked against that engine's rules).
"""

from __future__ import annotations

import copy
import hashlib
import math
import re
from collections.abc import Iterable
from dataclasses import replace
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from urllib.parse import urlsplit

from agent.discovery import is_mig_class
from agent.engines import ENGINES, RUNTIME_LORA_ENV, unsafe_args, unsafe_env
from catalog.durations import HOUR, MINUTE, SECOND, format_duration
from catalog.problems import PathPart, Problem
from catalog.spec import (
    Adapter,
    Canary,
    Model,
    Profile,
    ScaleWindow,
    Scaling,
)

CLASS_CRITICAL = "critical"
CLASS_STANDARD = "standard"
CLASS_OPPORTUNISTIC = "opportunistic"
CLASSES = (CLASS_CRITICAL, CLASS_STANDARD, CLASS_OPPORTUNISTIC)

ROLE_GUARD = "guard"
# The guard app reads these formats; the names live here because the catalog must not
# import the guard app (imports point one way: catalog <- guard).
GUARD_FORMATS = ("qwen3guard", "llamaguard3", "shieldgemma", "json")

FACILITY_LEVELS = ("rack", "row", "room", "site")

DEFAULT_STARTUP_TIMEOUT = 20 * MINUTE
MAX_PREWARM = 12 * HOUR

_DAY_MINUTES = 24 * 60
_WEEKDAYS: dict[str, tuple[int, ...]] = {
    "mon": (0,),
    "tue": (1,),
    "wed": (2,),
    "thu": (3,),
    "fri": (4,),
    "sat": (5,),
    "sun": (6,),
    "weekdays": (0, 1, 2, 3, 4),
    "weekends": (5, 6),
}
_CLOCK = re.compile(r"[0-9]{2}:[0-9]{2}")
_HF_HOSTS = ("https://huggingface.co/", "http://huggingface.co/", "https://hf.co/")
_OWNER_PREFIXES = ("org:", "team:", "project:")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


# Helpers


def cpu_capable(engine: str) -> bool:
    """Return whether an engine can serve a model without a GPU (llama.cpp only)."""
    return engine == "llamacpp"


def cpu_only(p: Profile) -> bool:
    """Return whether a profile needs no GPU: it names no class and its engine can.

    Only an engine that can serve without a card may leave the class out; otherwise an
    omitted class would quietly place a replica on a machine with nothing to run it.
    """
    return p.gpu_class == "" and cpu_capable(p.engine)


def on_demand(scaling: Scaling) -> bool:
    """Return whether a model is loaded when asked for: min 0 with a max above it.

    Min 0 and max 0 is different: configured and deliberately not running.
    """
    return scaling.min == 0 and scaling.max > 0


def is_guard(m: Model) -> bool:
    """Return whether a model judges traffic rather than serving it."""
    return m.role == ROLE_GUARD


def is_external(m: Model) -> bool:
    """Return whether a model is served by a provider outside the cluster."""
    return m.external is not None


def is_peer(m: Model) -> bool:
    """Return whether a model is offered by a federated cluster."""
    return m.external is not None and m.external.peer != ""


def effective_class(m: Model) -> str:
    """Return the class a model is treated as.

    What it says; when it says nothing, critical for a guard (every judged request
    waits on it), opportunistic for one loaded on demand (it holds capacity only while
    asked for) and standard for everything else.
    """
    if m.class_:
        return m.class_
    if is_guard(m):
        return CLASS_CRITICAL
    if on_demand(m.scaling):
        return CLASS_OPPORTUNISTIC
    return CLASS_STANDARD


def class_rank(c: str) -> int:
    """Return a class's rank: a higher rank may take capacity from a lower one."""
    if c == CLASS_CRITICAL:
        return 3
    if c in (CLASS_STANDARD, ""):
        return 2
    return 1


def valid_owner(o: str) -> bool:
    """Return whether an owner is written org:ID, team:ID or project:ID."""
    return any(o.startswith(p) and len(o) > len(p) for p in _OWNER_PREFIXES)


def parse_level(s: str) -> str:
    """Return a facility level (rack, row, room, site), trimmed and lowercased.

    Raises ValueError, naming the four, for anything else.
    """
    level = s.strip().lower()
    if level not in FACILITY_LEVELS:
        raise ValueError(f'"{s}" is not one of {", ".join(FACILITY_LEVELS)}')
    return level


def clock(s: str) -> int | None:
    """Return the minutes past midnight of an HH:MM time, or None if it is not one.

    Exactly two digits, a colon and two digits: the reference's scanf also took forms
    like ``+1:30`` or ``1:5x`` of the same length, which nobody means.
    """
    if not _CLOCK.fullmatch(s):
        return None
    h, m = int(s[:2]), int(s[3:])
    if h > 23 or m > 59:
        return None
    return h * 60 + m


def short_revision(rev: str) -> str:
    """Return a commit as a person writes it: its first eight characters."""
    return rev[:8]


def effective_scale(a: Adapter) -> float:
    """Return the scale an adapter is applied at: its own, or 1 when not above zero."""
    return a.scale if a.scale > 0 else 1.0


def kv_index(m: Model) -> bool:
    """Return whether the router routes a model by the KV cache its replicas report."""
    return any(p.kv_events for p in m.profiles)


def profile_by_name(m: Model, name: str) -> Profile | None:
    """Return a model's profile of this name, or None."""
    return next((p for p in m.profiles if p.name == name), None)


def simulated(m: Model) -> bool:
    """Return whether a model produces synthetic text: it has profiles, all of them sim.

    One real profile means a request can land on a real engine, and a model that
    sometimes answers for real must not be labelled as though it never does.
    """
    return bool(m.profiles) and all(p.engine == "sim" for p in m.profiles)


def suggest_cores(cpu_counts: Iterable[int]) -> int:
    """Return the cores to give a CPU replica on nodes of these CPU counts.

    Half of the smallest (at least 1), so two replicas share any of the nodes without
    competing; zero when no node reports, which reserves nothing.
    """
    smallest = min((c for c in cpu_counts if c > 0), default=0)
    return max(smallest // 2, 1) if smallest else 0


def canary_limits(c: Canary) -> tuple[int, float, float]:
    """Return a canary's rollback thresholds, defaults filled in (50, 0.05, 1.5).

    In order: min_requests, max_error_increase, max_ttft_ratio.
    """
    return (
        c.min_requests if c.min_requests > 0 else 50,
        c.max_error_increase if c.max_error_increase > 0 else 0.05,
        c.max_ttft_ratio if c.max_ttft_ratio > 0 else 1.5,
    )


def repository_page(source: str) -> str | None:
    """Return the repository id when source is a Hugging Face repository's page.

    A page is ``https://huggingface.co/org/repo`` or one of its tree views; a file under
    ``/resolve/`` is not one. None for anything else.
    """
    for host in _HF_HOSTS:
        if not source.startswith(host):
            continue
        parts = source[len(host) :].strip("/").split("/")
        if len(parts) < 2 or (len(parts) > 2 and parts[2] == "resolve"):
            return None
        return f"{parts[0]}/{parts[1]}"
    return None


# Schedule windows


def window_at(scaling: Scaling, t: datetime) -> ScaleWindow | None:
    """Return the schedule window in force at t, or None outside them all.

    t must be aware, already in the control time zone: the windows' days and clocks
    are read in t's tzinfo. The first window that holds wins. A window holds when t is
    in one of its openings that start yesterday, today or tomorrow (tomorrow's can open
    today, pulled forward by prewarm).

    Openings are read by the wall clock: a window from 08:00 opens at 08:00 local time
    on a day the clocks change too, and one to 17:00 closes at 17:00. (The reference
    counted elapsed time from local midnight, so on those days its windows opened an
    hour off; operators write wall-clock times and mean them.) A wall-clock time that
    does not exist on its day (inside a spring-forward gap) is read with the offset
    before the change, as zoneinfo reads it. Every comparison is on absolute time.
    Prewarm is elapsed time before the opening.
    """
    if t.tzinfo is None or t.utcoffset() is None:
        raise ValueError("window_at needs an aware datetime in the control time zone")
    now = _epoch_ns(t)
    today = t.date().toordinal()
    for w in scaling.schedule:
        if _holds(w, now, today, t, scaling.prewarm):
            return w
    return None


def _holds(w: ScaleWindow, now: int, today: int, t: datetime, lead: int) -> bool:
    # An unreadable clock counts as midnight, as the reference's does; a valid
    # catalog has none.
    start = clock(w.from_) or 0
    span = (clock(w.to) or 0) - start
    if span <= 0:
        span += _DAY_MINUTES  # past midnight
    for d in (-1, 0, 1):
        day = date.fromordinal(today + d)
        if not _starts_on(w, day.weekday()):
            continue
        midnight = datetime(day.year, day.month, day.day, tzinfo=t.tzinfo)
        # Aware arithmetic within one tzinfo is wall-clock arithmetic: these are the
        # local times the window names, whatever the offset on that day.
        opens = _epoch_ns(midnight + timedelta(minutes=start)) - lead
        closes = _epoch_ns(midnight + timedelta(minutes=start + span))
        if opens <= now < closes:
            return True
    return False


def _starts_on(w: ScaleWindow, weekday: int) -> bool:
    if not w.days:
        return True
    return any(weekday in _WEEKDAYS.get(d.lower(), ()) for d in w.days)


def _epoch_ns(t: datetime) -> int:
    d = t - _EPOCH
    return (d.days * 86_400 + d.seconds) * SECOND + d.microseconds * 1_000


# Fingerprint


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


# Defaults


def normalize(m: Model) -> Model:
    """Return a copy of a model with every default filled in; the input is left alone.

    Idempotent: normalizing a normalized model changes nothing.
    """
    m = copy.deepcopy(m)  # a private copy, so filling it in place touches no caller
    if m.scaling.min < 0:
        m.scaling.min = 0
    # Max 0 with min 0 is a statement (configured, deliberately not running), so it is
    # filled in only when min says replicas are wanted.
    if m.scaling.max == 0 and m.scaling.min > 0:
        m.scaling.max = m.scaling.min
    for p in m.profiles:
        _normalize_profile(p)
    # A repository page for a model vLLM or SGLang runs is the repository it names:
    # the engine downloads a repository id itself, where the page was fetched as one
    # file of HTML and failed at start. llama.cpp needs a file, so it is left to fail
    # the check with a message that says so.
    repo = repository_page(m.source)
    if repo and m.profiles and all(p.engine != "llamacpp" for p in m.profiles):
        m.source = repo
    return m


def _normalize_profile(p: Profile) -> None:
    if not p.engine:
        p.engine = "vllm"
    if p.tp <= 0:
        p.tp = 1
    if p.nodes <= 0:
        p.nodes = 1
    # tp on a llama.cpp GPU profile, written before gpus_per_node meant anything for
    # it, is read as the width it was meant as: N cards of one node. Only both given
    # and disagreeing is refused, as ambiguous. A negative gpus_per_node counts as
    # unset here, as it does below (the reference compared with 0 only, which made a
    # second pass rewrite what the first had not).
    if p.engine == "llamacpp" and p.gpu_class and (p.tp > 1 or p.pp > 1) and p.nodes == 1:
        n = p.tp * max(p.pp, 1)
        if p.gpus_per_node <= 0 or p.gpus_per_node == n:
            p.gpus_per_node, p.tp, p.pp = n, 1, 0
    if cpu_only(p):
        p.gpus_per_node = 0  # nothing to divide up: no cards at all
    elif p.gpus_per_node <= 0:
        p.gpus_per_node = max(p.tp // p.nodes, 1)
    if p.startup_timeout <= 0:
        p.startup_timeout = DEFAULT_STARTUP_TIMEOUT
    if p.weight <= 0:
        p.weight = 1.0


# Per-model rules

Path = tuple[PathPart, ...]


class _Found(list[Problem]):
    """The problems found so far, in the order they were found."""

    def add(self, path: Path, code: str, message: str) -> None:
        """Record a problem with the field at path."""
        self.append(Problem(path=path, message=message, code=code))


def check_model(m: Model) -> list[Problem]:
    """Return every problem with one model on its own, after normalizing it.

    Paths are relative to the model and name the field to change; the whole-catalog
    rules (names, aliases, fallbacks, canaries) are ``check_catalog``'s.
    """
    return _check_normalized(normalize(m))


def _check_normalized(m: Model) -> list[Problem]:
    out = _Found()
    if not m.name:
        out.add(("name",), "required", "the model has no name: give it one")
    if not m.source:
        out.add(
            ("source",),
            "required",
            "source is required: a weights path, a mirror path or a Hugging Face repository id",
        )
    elif repo := repository_page(m.source):
        # Only a model llama.cpp runs (or one with no profiles) still has a page after
        # normalize: a node would fetch the HTML as one file and the engine fail.
        if any(p.engine == "llamacpp" for p in m.profiles):
            instead = "llama.cpp needs a .gguf: mirror one and use its source"
        else:
            instead = "write the repository id or a file's path"
        out.add(
            ("source",),
            "repository_page",
            f"source {m.source} is a Hugging Face repository page, not a file; "
            f"{instead} (repository {repo})",
        )
    _check_adapters(m, out)
    if m.external is not None:
        _check_external(m, out)
    elif not m.profiles:
        out.add(
            ("profiles",),
            "no_profiles",
            "at least one profile is required: say how the model runs, or make it external",
        )
    _check_fields(m, out)
    _check_role(m, out)
    _check_scaling(m, out)
    seen: set[str] = set()
    for i, p in enumerate(m.profiles):
        _check_profile(m, p, ("profiles", i), _label(p, i), seen, out)
    return list(out)


def _label(p: Profile, i: int) -> str:
    return f'profile "{p.name}"' if p.name else f"profiles[{i}]"


def _num(v: float) -> str:
    return f"{v:g}"


def _check_adapters(m: Model, out: _Found) -> None:
    if m.max_loaded_adapters < 0:
        out.add(
            ("max_loaded_adapters",),
            "negative_max_loaded_adapters",
            "max_loaded_adapters cannot be negative: 0 loads every adapter at start, "
            "above 0 caps how many a replica holds",
        )
    # Unknown engines are reported by the profile check, and nothing else is said
    # about them.
    engines = [(i, p) for i, p in enumerate(m.profiles) if p.engine in ENGINES]
    if m.max_loaded_adapters > 0:
        # Loading on demand is vLLM's runtime LoRA API; llama-server can only change
        # the scale of adapters it loaded at start, so a cap there caps nothing.
        for i, p in engines:
            if p.engine != "vllm":
                out.add(
                    ("max_loaded_adapters",),
                    "max_loaded_adapters_engine",
                    f"{_label(p, i)} runs {p.engine}, but max_loaded_adapters needs "
                    "vllm profiles (llama.cpp loads every adapter at start): set it "
                    "to 0 or use vllm",
                )
    if not m.adapters:
        return
    if m.external is not None:
        out.add(
            ("adapters",),
            "external_adapters",
            "an external model cannot carry adapters: its provider serves it",
        )
    for i, p in engines:
        if p.engine not in ("llamacpp", "vllm", "sim"):
            out.add(
                ("profiles", i, "engine"),
                "adapter_engine",
                f"{_label(p, i)}: adapters are served by llamacpp and vllm profiles "
                f"only, not {p.engine}",
            )
        # The variable switches vLLM to loading on demand, and the router loads
        # adapters only for a model with a cap: set by hand, replicas would start
        # holding no adapter that anything ever loads.
        if RUNTIME_LORA_ENV in p.env and m.max_loaded_adapters == 0:
            out.add(
                ("profiles", i, "env", RUNTIME_LORA_ENV),
                "runtime_lora_env",
                f"{_label(p, i)}: set max_loaded_adapters rather than {RUNTIME_LORA_ENV}",
            )
    seen: set[str] = set()
    for j, a in enumerate(m.adapters):
        at: Path = ("adapters", j)
        who = f'adapter "{a.name}"'
        if not a.name or not a.source:
            missing = "source" if a.name else "name"
            out.add(
                (*at, missing),
                "required",
                f"{who if a.name else f'adapters[{j}]'} has no {missing}: an adapter "
                "needs a name and a source",
            )
            continue
        if a.name == m.name:
            out.add(
                (*at, "name"),
                "adapter_is_model_name",
                f"{who} has the model's own name: give it another",
            )
        elif a.name in seen:
            out.add(
                (*at, "name"),
                "duplicate_adapter",
                f"{who} is declared twice: give each adapter its own name",
            )
        seen.add(a.name)
        if not math.isfinite(a.scale):
            _not_finite(out, (*at, "scale"), f"{who}: scale", a.scale)
        elif a.scale < 0:
            out.add(
                (*at, "scale"),
                "negative_scale",
                f"{who} has a negative scale: give a positive one, or 0 for 1",
            )
        # Loaded on demand, the name is a file's name on the node.
        if m.max_loaded_adapters > 0 and ("/" in a.name or "\\" in a.name or a.name in (".", "..")):
            out.add(
                (*at, "name"),
                "adapter_name_path",
                f"{who} cannot contain a slash, or be . or .., when adapters load on "
                "demand: the name is a file's name on the node",
            )


def _check_external(m: Model, out: _Found) -> None:
    e = m.external
    assert e is not None  # the caller checked
    if m.profiles:
        out.add(
            ("profiles",),
            "external_profiles",
            "an external model is served elsewhere and has no profiles: remove them, "
            "or remove external",
        )
    if not _http_url(e.url):
        out.add(
            ("external", "url"),
            "bad_url",
            f'external url "{e.url}" is not an http(s) address: write the '
            "provider's base address, like https://api.openai.com",
        )
    if not e.model.strip():
        out.add(
            ("external", "model"),
            "required",
            "external model needs the name the provider knows it by",
        )


_URL_FORBIDDEN = re.compile(r"[\x00-\x20\x7f]")


def _http_url(u: str) -> bool:
    # Go's url.Parse refuses control characters, and a host with spaces or a port that
    # is not a number: ask the same of an http(s) address.
    if _URL_FORBIDDEN.search(u):
        return False
    try:
        parts = urlsplit(u)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        return False
    host = parts.netloc.rpartition("@")[2]
    return parts.scheme in ("http", "https") and host not in ("", ":")


def _not_finite(out: _Found, path: Path, what: str, v: float) -> None:
    # NaN passes every comparison the reference makes, and no JSON can carry it.
    out.add(path, "not_finite", f"{what} is {v}: write a finite number")


def _check_fields(m: Model, out: _Found) -> None:
    if m.owner and not valid_owner(m.owner):
        out.add(
            ("owner",),
            "bad_owner",
            f'owner "{m.owner}" is not org:ID, team:ID or project:ID: write one of '
            "those, or leave it empty for shared",
        )
    if m.class_ and m.class_ not in CLASSES:
        out.add(
            ("class",),
            "bad_class",
            f'class "{m.class_}" is not one of {", ".join(CLASSES)}',
        )
    if (g := m.eval) is not None:
        if not g.suite.strip():
            out.add(
                ("eval", "suite"),
                "required",
                "eval names no suite: name one in control.eval_dir or a built-in one "
                "(arithmetic, json-format)",
            )
        if not 0 <= g.min_score <= 1:  # NaN too
            out.add(
                ("eval", "min_score"),
                "min_score_range",
                f"eval min_score {_num(g.min_score)} is not 0 to 1 (0 takes the "
                "suite's own threshold)",
            )
    if (c := m.canary) is not None:
        if not c.model:
            out.add(
                ("canary", "model"),
                "required",
                "canary names no model: name the catalog model to send a share of requests to",
            )
        if not 0 <= c.percent <= 100:
            out.add(
                ("canary", "percent"),
                "canary_percent",
                f"canary percent {c.percent} is not 0 to 100",
            )
        for key in ("max_error_increase", "max_ttft_ratio"):
            if not math.isfinite(v := getattr(c, key)):
                _not_finite(out, ("canary", key), f"canary {key}", v)


def _check_role(m: Model, out: _Found) -> None:
    formats = ", ".join(GUARD_FORMATS)
    if m.role == "":
        if m.guard is not None:
            out.add(
                ("guard",),
                "guard_without_role",
                "guard: is for a model with role: guard; set the role or remove guard",
            )
        return
    if m.role != ROLE_GUARD:
        out.add(
            ("role",),
            "bad_role",
            f'role "{m.role}" is not guard: use guard for a judge, or leave it empty',
        )
        return
    if m.guard is None or not m.guard.format:
        out.add(
            ("guard", "format"),
            "required",
            f"a guard model needs guard.format: one of {formats}",
        )
    elif m.guard.format not in GUARD_FORMATS:
        out.add(
            ("guard", "format"),
            "unknown_guard_format",
            f'guard.format "{m.guard.format}" is not one of {formats}',
        )
    # A judge loaded on demand makes the first request of every idle period wait for
    # it, or be judged by nothing.
    if on_demand(m.scaling):
        out.add(
            ("scaling", "min"),
            "guard_on_demand",
            "a guard model must always run: set scaling.min to 1 or more",
        )
    if m.external is not None:
        out.add(
            ("external",),
            "guard_external",
            "a guard model judges in the cluster and cannot be external: give it profiles instead",
        )


def _check_scaling(m: Model, out: _Found) -> None:
    s = m.scaling
    for i, w in enumerate(s.schedule):
        at: Path = ("scaling", "schedule", i)
        name = f"scaling.schedule[{i}]"
        for key, value in (("from", w.from_), ("to", w.to)):
            if clock(value) is None:
                out.add(
                    (*at, key),
                    "bad_clock",
                    f'{name}: {key} "{value}" is not HH:MM, like 08:00',
                )
        if clock(w.from_) is not None and w.from_ == w.to:
            out.add(
                (*at, "to"),
                "empty_window",
                f"{name}: from and to are the same time ({w.to}): give the window a "
                "length (a to before from runs past midnight)",
            )
        for j, d in enumerate(w.days):
            if d.lower() not in _WEEKDAYS:
                out.add(
                    (*at, "days", j),
                    "bad_day",
                    f'{name}: day "{d}" is not mon … sun, weekdays or weekends',
                )
        if w.min < 0 or w.max < 0 or 0 < w.max < w.min:
            out.add(
                (*at, "min" if w.min < 0 else "max"),
                "bad_window_range",
                f"{name}: min {w.min} and max {w.max}: min is 0 or more, and max is 0 "
                "(the model's own) or at least min",
            )
    if not 0 <= s.prewarm <= MAX_PREWARM:
        out.add(
            ("scaling", "prewarm"),
            "prewarm_range",
            f"scaling.prewarm {format_duration(s.prewarm)} is not between 0 and 12h",
        )
    if s.max < s.min:
        out.add(
            ("scaling", "max"),
            "max_below_min",
            f"scaling max {s.max} is below min {s.min}: raise max or lower min",
        )


def _check_profile(m: Model, p: Profile, at: Path, label: str, seen: set[str], out: _Found) -> None:
    if not p.name:
        out.add((*at, "name"), "required", f"{label} has no name: give it one")
    elif p.name in seen:
        out.add(
            (*at, "name"),
            "duplicate_profile",
            f"{label} is declared twice: give each profile its own name",
        )
    seen.add(p.name)
    for key in sorted(p.env):
        if why := unsafe_env(key):
            out.add(
                (*at, "env", key),
                "unsafe_env",
                f"{label}: env {key} is not allowed: {why}",
            )
    if not math.isfinite(p.weight):
        _not_finite(out, (*at, "weight"), f"{label}: weight", p.weight)
    if not math.isfinite(p.power_watts):
        _not_finite(out, (*at, "power_watts"), f"{label}: power_watts", p.power_watts)
    elif p.power_watts < 0:
        out.add(
            (*at, "power_watts"),
            "negative_power",
            f"{label}: power_watts {_num(p.power_watts)} is negative: give what one "
            "replica draws, or 0 to derive it",
        )
    if p.keep_within:
        try:
            parse_level(p.keep_within)
        except ValueError as e:
            out.add((*at, "keep_within"), "bad_level", f"{label}: keep_within {e}")
    if p.engine not in ENGINES:
        # Every rule below depends on what the engine is.
        why = unsafe_args(p.engine, [])
        out.add((*at, "engine"), "unknown_engine", f"{label}: {why}")
        return
    for arg in p.args:
        if why := unsafe_args(p.engine, [arg]):
            out.add((*at, "args"), "unsafe_arg", f"{label}: {why}")
    if p.kv_events and p.engine != "vllm":
        out.add(
            (*at, "kv_events"),
            "kv_events_engine",
            f"{label}: kv_events is vLLM's; engine {p.engine} publishes no cache "
            "events: turn it off or use vllm",
        )
    _check_width(m, p, at, label, out)


def _check_width(m: Model, p: Profile, at: Path, label: str, out: _Found) -> None:
    """Check a profile's cards and nodes against its engine's limits."""
    if p.gpu_class == "" and not cpu_capable(p.engine):
        out.add(
            (*at, "gpu_class"),
            "gpu_class_required",
            f"{label}: gpu_class is required for engine {p.engine}; only llamacpp "
            "runs without a GPU",
        )
    if cpu_only(p):
        if p.nodes > 1:
            out.add(
                (*at, "nodes"),
                "cpu_multi_node",
                f"{label}: a CPU profile cannot span {p.nodes} nodes: give it 1",
            )
        return
    # A process sees one MIG device, and instances have no NVLink or peer-to-peer
    # between them: a group of them is a replica that fails at start.
    wide = p.gpus_per_node > 1 or p.nodes > 1 or p.tp > 1 or p.pp > 1
    if is_mig_class(p.gpu_class) and wide:
        out.add(
            (*at, "gpu_class"),
            "mig_multi",
            f"{label}: {p.gpu_class} is a MIG instance, and a replica runs on exactly "
            "one: a process can open only one MIG device, and instances have no NVLink "
            "between them. Give it tp 1 and one GPU on one node, or use a whole-card "
            "class or a larger MIG profile",
        )
        return
    # llama.cpp splits a model across one node's cards by layer, as many as
    # gpus_per_node; it has no tensor parallelism to give a tp to.
    if p.engine == "llamacpp":
        if p.nodes > 1:
            out.add(
                (*at, "nodes"),
                "llamacpp_multi_node",
                f"{label}: llama.cpp does not span nodes; use vllm or sglang for a "
                f"{p.nodes}-node replica",
            )
        elif p.tp > 1 or p.pp > 1:
            out.add(
                (*at, "tp" if p.tp > 1 else "pp"),
                "llamacpp_tp",
                f"{label}: llama.cpp splits a model across a node's GPUs by layer, and "
                f"tp {p.tp * max(p.pp, 1)} does not agree with gpus_per_node "
                f"{p.gpus_per_node}: give gpus_per_node alone",
            )
        return
    # TensorRT-LLM spans machines only under MPI started from one of them, which the
    # agents do not do; and it loads a Hugging Face checkpoint, not a GGUF.
    if p.engine == "trtllm":
        if m.source.rstrip("/").lower().endswith(".gguf"):
            out.add(
                ("source",),
                "trtllm_gguf",
                f"{label}: trtllm loads a Hugging Face checkpoint, not a .gguf; serve "
                "a GGUF with llamacpp",
            )
        if p.nodes > 1:
            out.add(
                (*at, "nodes"),
                "trtllm_multi_node",
                f"{label}: trtllm runs a replica on one node; use vllm or sglang for a "
                f"{p.nodes}-node replica",
            )
            return
    # Otherwise the engine is handed a shard spec it cannot satisfy, and fails minutes
    # later while loading.
    pp = max(p.pp, 1)
    if p.gpus_per_node * p.nodes != p.tp * pp:
        out.add(
            (*at, "tp"),
            "tp_mismatch",
            f"{label}: {p.nodes} nodes x {p.gpus_per_node} GPUs does not match tp "
            f"{p.tp} x pp {pp}: make nodes x gpus_per_node equal tp x pp",
        )


# Whole-catalog rules


def check_catalog(models: list[Model]) -> list[Problem]:
    """Return every problem with a catalog: each model's own, then those between them.

    Each problem carries its model's name and position in ``models``. Names, aliases
    and adapters share one namespace (a collision would silently shadow a model at
    request time); fallbacks and canaries must resolve now, not during an outage.
    """
    ms = [normalize(m) for m in models]
    out: list[Problem] = []
    for i, m in enumerate(ms):
        out += [replace(p, model=m.name, index=i) for p in _check_normalized(m)]

    def add(i: int, path: Path, code: str, message: str) -> None:
        out.append(Problem(path, message, code, model=ms[i].name, index=i))

    # The first of two models of one name is the one the rest are checked against;
    # the second is only reported, as checking it would repeat every clash.
    first: dict[str, int] = {}
    for i, m in enumerate(ms):
        if m.name in first:
            add(
                i,
                ("name",),
                "duplicate_name",
                f'model "{m.name}" is declared twice (first at '
                f"models[{first[m.name]}]): give each model its own name",
            )
        elif m.name:
            first[m.name] = i
    kept = [(i, ms[i]) for i in first.values()]
    aliases: dict[str, str] = {}
    for i, m in kept:
        for j, a in enumerate(m.aliases):
            if a in first:
                whose = "the model's own" if a == m.name else "another model's"
                add(
                    i,
                    ("aliases", j),
                    "alias_collision",
                    f'alias "{a}" is {whose} name: names and aliases share one '
                    "namespace; remove or rename it",
                )
            elif a in aliases:
                owner = "this model" if aliases[a] == m.name else f'"{aliases[a]}"'
                add(
                    i,
                    ("aliases", j),
                    "alias_claimed",
                    f'alias "{a}" is already an alias of {owner}: an alias is listed '
                    "once and names one model",
                )
            else:
                aliases[a] = m.name
    adapters: dict[str, str] = {}
    for i, m in kept:
        own: set[str] = set()
        for j, a in enumerate(m.adapters):
            # Empty, repeated and model-named adapters are check_model's to report.
            if not a.name or a.name in own or a.name == m.name:
                continue
            own.add(a.name)
            if a.name in first:
                clash = f'the model "{a.name}"'
            elif a.name in aliases:
                clash = f'an alias of "{aliases[a.name]}"'
            elif a.name in adapters:
                clash = f'an adapter of "{adapters[a.name]}"'
            else:
                adapters[a.name] = m.name
                continue
            add(
                i,
                ("adapters", j, "name"),
                "adapter_collision",
                f'adapter "{a.name}" collides with {clash}: adapters, aliases and '
                "model names share one namespace",
            )

    def resolve(name: str) -> Model | None:
        base = name if name in first else aliases.get(name)
        return ms[first[base]] if base is not None else None

    for i, m in kept:
        for j, f in enumerate(m.fallbacks):
            if resolve(f) is None:
                add(
                    i,
                    ("fallbacks", j),
                    "unknown_fallback",
                    f'fallback "{f}" is not in the catalog: name a model or an alias',
                )
    # A canary is a candidate for this model's place: another catalog model, not a
    # judge, not itself tested against a canary, and the candidate of one model only.
    # Its percent is check_model's.
    canary_of: dict[str, str] = {}
    for i, m in kept:
        if m.canary is None or not m.canary.model:
            continue
        c = m.canary.model
        target = resolve(c)
        if target is None:
            code, what = "unknown_canary", f'canary "{c}" is not in the catalog'
        elif target.name == m.name:
            code, what = "canary_self", "a model cannot be its own canary"
        elif is_guard(target):
            code, what = "canary_guard", f'canary "{c}" is a guard model'
        elif target.canary is not None:
            code, what = "canary_chained", f'canary "{c}" has a canary of its own'
        elif target.name in canary_of:
            code = "canary_taken"
            what = f'"{c}" is already the canary of "{canary_of[target.name]}"'
        else:
            canary_of[target.name] = m.name
            continue
        add(i, ("canary", "model"), code, f"{what}: name another catalog model")
    return out


class Catalog:
    """The set of models the cluster should serve, looked up by name, alias or adapter.

    Built from models that are already normalized and valid (``build_catalog`` makes
    sure); it checks nothing itself.
    """

    def __init__(self, models: Iterable[Model]) -> None:
        """Index the models by name, their aliases and their adapters' names."""
        self._models: dict[str, Model] = {}
        self._aliases: dict[str, str] = {}
        self._adapters: dict[str, str] = {}
        for m in models:
            self._models.setdefault(m.name, m)
        for m in self._models.values():
            for a in m.aliases:
                self._aliases.setdefault(a, m.name)
            for ad in m.adapters:
                self._adapters.setdefault(ad.name, m.name)

    def models(self) -> list[Model]:
        """Return every model, in declaration order."""
        return list(self._models.values())

    def names(self) -> list[str]:
        """Return the models' names, sorted."""
        return sorted(self._models)

    def resolve(self, name: str) -> Model | None:
        """Return the model a client-supplied name or alias means, or None."""
        base = name if name in self._models else self._aliases.get(name)
        return self._models[base] if base is not None else None

    def resolve_adapter(self, name: str) -> tuple[Model, Adapter, int] | None:
        """Return an adapter's model, the adapter and its index (the engine's id)."""
        base = self._adapters.get(name)
        if base is None:
            return None
        m = self._models[base]
        return next(((m, a, i) for i, a in enumerate(m.adapters) if a.name == name))

    def aliases_of(self, name: str) -> list[str]:
        """Return the aliases of the model a name or alias means (empty if none)."""
        m = self.resolve(name)
        return list(m.aliases) if m else []

    def canary_of(self, name: str) -> str:
        """Return the name of the model whose canary this model is, or ""."""
        for m in self._models.values():
            if m.canary is not None and self._means(m.canary.model, name):
                return m.name
        return ""

    def dependents(self, name: str) -> list[tuple[str, str]]:
        """Return (model, how) for each other model whose fallbacks or canary name it.

        ``how`` is ``"fallbacks"`` or ``"canary"``; a reference by an alias counts.
        Used to refuse deleting or renaming a model others depend on, and to show what
        does. A model's references to itself do not count: they go with it.
        """
        target = self.resolve(name)
        if target is None:
            return []
        out: list[tuple[str, str]] = []
        for m in self._models.values():
            if m.name == target.name:
                continue
            if any(self._means(f, target.name) for f in m.fallbacks):
                out.append((m.name, "fallbacks"))
            if m.canary is not None and self._means(m.canary.model, target.name):
                out.append((m.name, "canary"))
        return out

    def _means(self, ref: str, name: str) -> bool:
        m = self.resolve(ref)
        return m is not None and m.name == name


def build_catalog(models: list[Model]) -> tuple[Catalog | None, list[Problem]]:
    """Return the catalog of these models, or None and every reason it cannot be."""
    problems = check_catalog(models)
    if problems:
        return None, problems
    return Catalog(normalize(m) for m in models), []
