"""Defaults: a copy of a model with every default filled in."""

from __future__ import annotations

import copy
import dataclasses

from catalog.rules.constants import DEFAULT_STARTUP_TIMEOUT
from catalog.rules.helpers import cpu_only, repository_page
from catalog.spec import Model, Profile


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
    m.source = _source(m.source, m.profiles)
    return m


def normalized_profiles(m: Model) -> tuple[str, list[Profile]]:
    """Return a model's source and profiles as ``normalize`` fills them in, copying
    only the profiles, shallowly (filling one in sets only its own fields): what
    placement reads of a model, without copying the rest of it. The input is left alone.
    """
    profiles = [copy.copy(p) for p in m.profiles]
    for p in profiles:
        _normalize_profile(p)
    return _source(m.source, profiles), profiles


def _source(source: str, profiles: list[Profile]) -> str:
    """Return a model's source with its profiles filled in.

    A repository page for a model vLLM or SGLang runs is the repository it names:
    the engine downloads a repository id itself, where the page was fetched as one
    file of HTML and failed at start. llama.cpp needs a file, so it is left to fail
    the check with a message that says so.
    """
    repo = repository_page(source)
    if repo and profiles and all(p.engine != "llamacpp" for p in profiles):
        return repo
    return source


def keep_origin(new: Model, before: Model | None) -> Model:
    """Return ``new`` with ``before``'s origin when ``new`` gives none and names the same
    source (normalized); otherwise ``new`` as it is. The input is left alone.

    The origin is what the mirror recorded of the registry (the commit, each file's
    sha256, the revision an update replaced), not something an operator writes: a catalog
    file or a whole model put by hand leaves it out, and leaving it out is not asking to
    forget it (the update check, the rollback and what the mirror keeps all read it).
    Another source's origin describes other weights, so it is not kept. To drop it, a
    merge patch sets ``origin`` to null (or the admin clears it).
    """
    if new.origin is not None or before is None or before.origin is None:
        return new
    if normalize(new).source != normalize(before).source:
        return new
    return dataclasses.replace(new, origin=copy.deepcopy(before.origin))


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
