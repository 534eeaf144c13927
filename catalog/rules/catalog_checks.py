"""Whole-catalog rules, and the catalog they let through.

``check_catalog`` checks each model and then what lies between them (names, aliases,
adapters, fallbacks, canaries); ``Catalog`` looks models up by name, alias or adapter,
and ``build_catalog`` makes one only from a catalog that passes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace

from catalog.problems import Problem
from catalog.rules.constants import RESIDENCY_LOCAL
from catalog.rules.environment import STRICT, Environment
from catalog.rules.found import Path
from catalog.rules.helpers import is_guard
from catalog.rules.model_checks import check_normalized
from catalog.rules.normalize import normalize
from catalog.rules.profile_checks import profile_warnings
from catalog.spec import Adapter, Model


def catalog_warnings(models: list[Model]) -> list[Problem]:
    """Return what a catalog is allowed but may not do what is meant (each model's, with
    its name and position): surfaces show these beside a change, which is made all the
    same (an environment variable its engine does not document)."""
    out: list[Problem] = []
    for i, m in enumerate(models):
        n = normalize(m)
        out += [replace(p, model=n.name, index=i) for p in profile_warnings(n)]
    return out


def check_catalog(models: list[Model], env: Environment = STRICT) -> list[Problem]:
    """Return every problem with a catalog: each model's own, then those between them.

    ``env`` is what the installation allows (``catalog.rules.environment``): the
    strictest without it.

    Each problem carries its model's name and position in ``models``. Names, aliases
    and adapters share one namespace (a collision would silently shadow a model at
    request time); fallbacks and canaries must resolve now, not during an outage.
    """
    ms = [normalize(m) for m in models]
    out: list[Problem] = []
    for i, m in enumerate(ms):
        out += [replace(p, model=m.name, index=i) for p in check_normalized(m, env)]

    def add(i: int, path: Path, code: str, message: str) -> None:
        out.append(Problem(path, message, code, model=ms[i].name, index=i))

    first = _names(ms, add)
    kept = [(i, ms[i]) for i in first.values()]
    aliases = _aliases(kept, first, add)
    _adapters(kept, first, aliases, add)

    def resolve(name: str) -> Model | None:
        base = name if name in first else aliases.get(name)
        return ms[first[base]] if base is not None else None

    _fallbacks(kept, resolve, add)
    _canaries(kept, resolve, add)
    _overflows(kept, resolve, add)
    _residency(kept, resolve, add)
    return out


Add = Callable[[int, Path, str, str], None]
Resolve = Callable[[str], "Model | None"]


def _names(ms: list[Model], add: Add) -> dict[str, int]:
    """Return where each name is first declared; report the second of two of one name.

    The first is the one the rest are checked against; the second is only reported, as
    checking it would repeat every clash.
    """
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
    return first


def _aliases(kept: list[tuple[int, Model]], first: dict[str, int], add: Add) -> dict[str, str]:
    """Return each alias's model; report an alias that is a name or another's alias."""
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
    return aliases


def _adapters(
    kept: list[tuple[int, Model]], first: dict[str, int], aliases: dict[str, str], add: Add
) -> None:
    """Report an adapter whose name is a model's, an alias or another model's adapter."""
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


def _fallbacks(kept: list[tuple[int, Model]], resolve: Resolve, add: Add) -> None:
    """Report a fallback that is not in the catalog, or is a judge."""
    for i, m in kept:
        for j, f in enumerate(m.fallbacks):
            target = resolve(f)
            if target is None:
                add(
                    i,
                    ("fallbacks", j),
                    "unknown_fallback",
                    f'fallback "{f}" is not in the catalog: name a model or an alias',
                )
            elif is_guard(target):
                # A judge serves no client: its replicas are the guard's, sized for it.
                add(
                    i,
                    ("fallbacks", j),
                    "fallback_guard",
                    f'fallback "{f}" is a guard model, which judges traffic and answers no '
                    "client: name another model",
                )


def _canaries(kept: list[tuple[int, Model]], resolve: Resolve, add: Add) -> None:
    """Report a canary that is not another catalog model, a judge, tested against a canary
    itself, or the candidate of two models. Its percent is check_model's."""
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


def _overflows(kept: list[tuple[int, Model]], resolve: Resolve, add: Add) -> None:
    """Report an overflow that is not in the catalog, or is a judge (its own name is
    check_model's)."""
    for i, m in kept:
        if not m.overflow or m.overflow == m.name:
            continue
        target = resolve(m.overflow)
        if target is None:
            add(i, ("overflow",), "unknown_overflow",
                f'overflow "{m.overflow}" is not in the catalog: name a model or an alias')  # fmt: skip
        elif is_guard(target):
            add(i, ("overflow",), "overflow_guard",
                f'overflow "{m.overflow}" is a guard model, which answers no client: name '
                "another model")  # fmt: skip


def _peer_model(m: Model | None) -> bool:
    return m is not None and m.external is not None and bool(m.external.peer)


def _residency(kept: list[tuple[int, Model]], resolve: Resolve, add: Add) -> None:
    """Report a ``residency: local`` model that names a federated peer's model as a
    fallback, canary or overflow: its requests would leave for the peer."""
    for i, m in kept:
        if m.residency != RESIDENCY_LOCAL:
            continue
        hops: list[tuple[Path, str, str]] = [
            (("fallbacks", j), "fallback", f) for j, f in enumerate(m.fallbacks)
        ]
        if m.canary is not None and m.canary.model:
            hops.append((("canary", "model"), "canary", m.canary.model))
        if m.overflow:
            hops.append((("overflow",), "overflow", m.overflow))
        for path, what, ref in hops:
            target = resolve(ref)
            if _peer_model(target):
                assert target is not None and target.external is not None
                add(
                    i,
                    path,
                    "local_to_peer",
                    f'{what} "{ref}" is a model of the federated cluster '
                    f'"{target.external.peer}", and this model is residency: local, whose '
                    "requests never leave for a peer: name a model of this cluster, or "
                    "remove residency: local",
                )


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
            if m.overflow and self._means(m.overflow, target.name):
                out.append((m.name, "overflow"))
        return out

    def _means(self, ref: str, name: str) -> bool:
        m = self.resolve(ref)
        return m is not None and m.name == name


def build_catalog(
    models: list[Model], env: Environment = STRICT
) -> tuple[Catalog | None, list[Problem]]:
    """Return the catalog of these models, or None and every reason it cannot be."""
    problems = check_catalog(models, env)
    if problems:
        return None, problems
    return Catalog(normalize(m) for m in models), []
