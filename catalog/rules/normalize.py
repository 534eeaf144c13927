"""Defaults: a model with every default filled in, copied where it changes."""

from __future__ import annotations

import copy
import dataclasses

from catalog.rules.constants import DEFAULT_STARTUP_TIMEOUT
from catalog.rules.helpers import cpu_capable, repository_page
from catalog.spec import Model, Profile


def normalize(m: Model) -> Model:
    """Return a model with every default filled in; the input is left alone.

    Copy on write: the model returned is a new one, and so are its scaling and each
    profile where a default was filled in; what needed nothing (its aliases, adapters,
    the profiles already complete...) is shared with the input, not copied. A deep copy
    of each model was 70 % of checking a 2,000-model catalog. So neither the input nor
    the result may be changed in place by a caller: each is read, never written.

    Idempotent: normalizing a normalized model changes nothing.
    """
    scaling = m.scaling
    low = max(scaling.min, 0)
    # Max 0 with min 0 is a statement (configured, deliberately not running), so it is
    # filled in only when min says replicas are wanted.
    high = low if scaling.max == 0 and low > 0 else scaling.max
    if (low, high) != (scaling.min, scaling.max):
        scaling = dataclasses.replace(scaling, min=low, max=high)
    profiles = [_normalize_profile(p) for p in m.profiles]
    source = _source(m.source, profiles)
    return dataclasses.replace(m, scaling=scaling, profiles=profiles, source=source)


def normalized_profiles(m: Model) -> tuple[str, list[Profile]]:
    """Return a model's source and profiles as ``normalize`` fills them in, copying
    only the profiles, shallowly (filling one in sets only its own fields): what
    placement reads of a model, without copying the rest of it. The input is left alone.
    """
    profiles = [_normalize_profile(p) for p in m.profiles]
    profiles = [copy.copy(q) if q is p else q for p, q in zip(m.profiles, profiles, strict=True)]
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


def _normalize_profile(p: Profile) -> Profile:
    """Return the profile with its defaults filled in: itself when it needed none, else a
    copy with them (the input is left alone)."""
    engine = p.engine or "vllm"
    tp = 1 if p.tp <= 0 else p.tp
    nodes = 1 if p.nodes <= 0 else p.nodes
    pp, per_node = p.pp, p.gpus_per_node
    # tp on a llama.cpp GPU profile, written before gpus_per_node meant anything for
    # it, is read as the width it was meant as: N cards of one node. Only both given
    # and disagreeing is refused, as ambiguous. A negative gpus_per_node counts as
    # unset here, as it does below (the reference compared with 0 only, which made a
    # second pass rewrite what the first had not).
    if engine == "llamacpp" and p.gpu_class and (tp > 1 or pp > 1) and nodes == 1:
        n = tp * max(pp, 1)
        if per_node <= 0 or per_node == n:
            per_node, tp, pp = n, 1, 0
    if p.gpu_class == "" and cpu_capable(engine):  # cpu_only, with the engine filled in
        per_node = 0  # nothing to divide up: no cards at all
    elif per_node <= 0:
        per_node = max(tp // nodes, 1)
    filled = {
        "engine": engine,
        "tp": tp,
        "nodes": nodes,
        "pp": pp,
        "gpus_per_node": per_node,
        "startup_timeout": DEFAULT_STARTUP_TIMEOUT if p.startup_timeout <= 0 else p.startup_timeout,
        # A weight that is no number (NaN) is left as it is, to be refused by the check.
        "weight": 1.0 if p.weight <= 0 else p.weight,
    }
    changed = {k: v for k, v in filled.items() if getattr(p, k) is not v}
    return dataclasses.replace(p, **changed) if changed else p
