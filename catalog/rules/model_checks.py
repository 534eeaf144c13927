"""Per-model rules: every problem with one model on its own.

``check_model`` and the checks of a model's source, adapters, external provider, owner,
class, eval gate, canary, role and scaling; each profile is checked by
``catalog.rules.profile_checks``.
"""

from __future__ import annotations

import math
import re
from urllib.parse import urlsplit

from agent.engines import ENGINES
from catalog.durations import format_duration
from catalog.problems import Problem
from catalog.rules.constants import CLASSES, GUARD_FORMATS, MAX_PREWARM, RESIDENCIES, ROLE_GUARD
from catalog.rules.environment import STRICT, Environment, key_file, url_problem
from catalog.rules.found import Found, Path, not_finite, num, profile_label
from catalog.rules.helpers import on_demand, repository_page, valid_owner
from catalog.rules.names import bad_character, name_problem, shown
from catalog.rules.normalize import normalize
from catalog.rules.profile_checks import check_profile
from catalog.rules.schedule import WEEKDAYS, clock
from catalog.spec import Model


def check_model(m: Model, env: Environment = STRICT) -> list[Problem]:
    """Return every problem with one model on its own, after normalizing it.

    Paths are relative to the model and name the field to change; the whole-catalog
    rules (names, aliases, fallbacks, canaries) are ``check_catalog``'s. ``env`` is what
    the installation allows (``catalog.rules.environment``); the strictest without it.
    """
    return check_normalized(normalize(m), env)


def check_normalized(m: Model, env: Environment = STRICT) -> list[Problem]:
    out = Found()
    if not m.name:
        out.add(("name",), "required", "the model has no name: give it one")
    _check_names(m, out)
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
        _check_external(m, out, env)
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
        check_profile(m, p, ("profiles", i), profile_label(p, i), seen, out)
    return list(out)


def _check_names(m: Model, out: Found) -> None:
    """Refuse a name a client, a page or a URL cannot carry (``names.name_problem``; the
    owner's is ``_check_fields``').

    The external model is the provider's own id, sent only in a request body: it is held
    to one line of visible characters.
    """
    named: list[tuple[Path, str, str]] = [(("name",), "name", m.name)] if m.name else []
    named += [(("aliases", j), "alias", a) for j, a in enumerate(m.aliases)]
    named += [
        (("adapters", j, "name"), "adapter name", a.name)
        for j, a in enumerate(m.adapters)
        # Loaded on demand, a path-like name is refused as a file's name on the node.
        if not (m.max_loaded_adapters > 0 and _path_like(a.name))
    ]
    for path, what, text in named:
        if bad := bad_character(text):
            out.add(
                path,
                "control_character",
                f'{what} "{shown(text)}" holds {bad}: a name is one line of visible '
                "characters (it goes into URLs, headers and metrics); remove it",
            )
        elif text and (why := name_problem(text)):
            out.add(path, "bad_name", f'{what} "{text}" {why}')
    _check_origin(m, out)
    if m.external is not None and (bad := bad_character(m.external.model)):
        out.add(
            ("external", "model"),
            "control_character",
            f'external model "{shown(m.external.model)}" holds {bad}: a name is one line of '
            "visible characters (it goes into URLs, headers and metrics); remove it",
        )


def _check_origin(m: Model, out: Found) -> None:
    """Refuse a control or invisible character in what the origin names: the repository,
    the commit and each file's path go into the mirror's URLs and the update's pages."""
    if m.origin is None:
        return
    texts: list[tuple[Path, str, str]] = [
        (("origin", "repo"), "origin repository", m.origin.repo),
        (("origin", "revision"), "origin revision", m.origin.revision),
    ]
    texts += [
        (("origin", "files", i, "path"), "origin file", f.path)
        for i, f in enumerate(m.origin.files)
    ]
    if (before := m.origin.previous) is not None:
        texts.append((("origin", "previous", "source"), "previous source", before.source))
        texts += [
            (("origin", "previous", "files", i, "path"), "previous origin file", f.path)
            for i, f in enumerate(before.files)
        ]
    for path, what, text in texts:
        if bad := bad_character(text):
            out.add(
                path,
                "control_character",
                f'{what} "{shown(text)}" holds {bad}: a name or a path is one line of '
                "visible characters (it goes into URLs and pages); remove it",
            )


def _path_like(name: str) -> bool:
    """Return whether an adapter's name would be read as a path on the node."""
    return "/" in name or "\\" in name or name in (".", "..")


def _check_adapters(m: Model, out: Found) -> None:
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
                    f"{profile_label(p, i)} runs {p.engine}, but max_loaded_adapters needs "
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
                f"{profile_label(p, i)}: adapters are served by llamacpp and vllm profiles "
                f"only, not {p.engine}",
            )
        # RUNTIME_LORA_ENV by hand is refused with the profile's env (agent.flags):
        # the agent sets it from max_loaded_adapters.
    _check_each_adapter(m, out)


def _check_each_adapter(m: Model, out: Found) -> None:
    """Check each adapter: its name and source, its name's uniqueness, its scale."""
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
            not_finite(out, (*at, "scale"), f"{who}: scale", a.scale)
        elif a.scale < 0:
            out.add(
                (*at, "scale"),
                "negative_scale",
                f"{who} has a negative scale: give a positive one, or 0 for 1",
            )
        # Loaded on demand, the name is a file's name on the node.
        if m.max_loaded_adapters > 0 and _path_like(a.name):
            out.add(
                (*at, "name"),
                "adapter_name_path",
                f"{who} cannot contain a slash, or be . or .., when adapters load on "
                "demand: the name is a file's name on the node",
            )


def _check_external(m: Model, out: Found, env: Environment) -> None:
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
    elif why := url_problem(e.url, env.http_hosts):
        out.add(("external", "url"), "plain_http", f'external url "{e.url}" {why}')
    if e.api_key_file:
        _, why = key_file(e.api_key_file, env.secrets_dir)
        if why:
            code = "key_file_outside" if env.secrets_dir else "no_secrets_dir"
            out.add(
                ("external", "api_key_file"),
                code,
                f'external api_key_file "{e.api_key_file}" {why}'
                if env.secrets_dir
                else f"external api_key_file: {why}",
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


# Characters an owner may not hold besides the refused ones (names.bad_character): the
# gateway hands it to clients as /v1/models' owned_by, and pages show it.
_OWNER_MARKUP = frozenset("<>\"&'`")


def _check_fields(m: Model, out: Found) -> None:
    bad = bad_character(m.owner) or next((f'"{c}"' for c in m.owner if c in _OWNER_MARKUP), None)
    if bad:
        out.add(
            ("owner",),
            "bad_owner",
            f'owner "{shown(m.owner)}" holds {bad}: it is sent to clients as /v1/models\' '
            "owned_by and shown on pages; write org:ID, team:ID or project:ID in letters, "
            "digits and . _ - : / @",
        )
    elif m.owner and not valid_owner(m.owner):
        out.add(
            ("owner",),
            "bad_owner",
            f'owner "{m.owner}" is not org:ID, team:ID or project:ID: write one of '
            "those, or leave it empty for shared",
        )
    elif m.owner and (why := name_problem(m.owner)):
        # The owner's page is reached by its name (cluster:owner_detail).
        out.add(("owner",), "bad_owner", f'owner "{m.owner}" {why}')
    if m.class_ and m.class_ not in CLASSES:
        out.add(
            ("class",),
            "bad_class",
            f'class "{m.class_}" is not one of {", ".join(CLASSES)}',
        )
    if m.capabilities.rerank:
        for i, p in enumerate(m.profiles):
            if p.engine == "trtllm":  # its reranker is a separate command the agent never runs
                out.add(
                    ("capabilities", "rerank"),
                    "rerank_engine",
                    f"{profile_label(p, i)} runs trtllm, which the agent does not start as a "
                    "reranker: use llamacpp, vllm or sglang for a rerank model",
                )
    if m.residency and m.residency not in RESIDENCIES:
        out.add(
            ("residency",),
            "bad_residency",
            f'residency "{shown(m.residency)}" is not local: write local for a model that '
            "never crosses to a federated cluster, or leave it out",
        )
    if m.overflow:
        if m.overflow == m.name:
            out.add(("overflow",), "overflow_self",
                    "a model cannot overflow to itself: name another catalog model")  # fmt: skip
        elif not m.slo.ttft_p99:
            out.add(
                ("overflow",),
                "overflow_needs_slo",
                f'overflow "{shown(m.overflow)}" is used only while admission holds a lower '
                "band back, which it does only past the model's slo.ttft_p99: set one",
            )
    if not 0 <= m.cached_token_weight <= 1:  # NaN too
        out.add(
            ("cached_token_weight",),
            "cached_token_weight_range",
            f"cached_token_weight {num(m.cached_token_weight)} is not 0 to 1: what a token "
            "budget charges for a cached prompt token (1 as much as a fresh one, 0 nothing)",
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
                f"eval min_score {num(g.min_score)} is not 0 to 1 (0 takes the "
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
                not_finite(out, ("canary", key), f"canary {key}", v)


def _check_role(m: Model, out: Found) -> None:
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


def _check_scaling(m: Model, out: Found) -> None:
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
            if d.lower() not in WEEKDAYS:
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
