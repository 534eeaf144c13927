"""The catalog's rules: defaults, per-model checks, whole-catalog checks and helpers.

Plain Python on the dataclasses of ``catalog.spec``, with no Django import, so a whole
catalog file can be checked before anything touches the database. ``Model.clean()``,
the forms, the admin, the API serializers and the file import all call these functions
and never re-implement them.

A port of the reference's ``catalog`` package (``shared/seed/catalog.go.txt``).
Where the reference stops at its first error, ``check_model`` and ``check_catalog``
report every problem, except where one problem makes the checks after it meaningless
(a profile whose engine is unknown is not checked against that engine's rules).

Everything public is importable from here; by topic, it lives in:

- ``constants``: the capacity classes, the guard role and formats, the facility levels,
  and the defaults (``DEFAULT_STARTUP_TIMEOUT``, ``MAX_PREWARM``).
- ``helpers``: small predicates and readings (``cpu_only``, ``effective_class``,
  ``class_rank``, ``on_demand``, ``is_guard``, ``simulated``, ``canary_limits``,
  ``repository_page``, ``parse_level``, ``suggest_cores`` and the like).
- ``schedule``: ``clock`` and ``window_at``, the schedule window in force at a time.
- ``fingerprint``: ``fingerprint``, a profile's hash over its Go-JSON rendering.
- ``normalize``: ``normalize``, a model with every default filled in; ``normalized_profiles``,
  its source and profiles alone.
- ``environment``: ``Environment``, what the installation allows that a rule depends on
  (the secrets folder, plain-http hosts), passed in by the caller; ``key_file`` and
  ``url_problem``, the checks the gateway asks again when it reads and sends.
- ``found``: what the per-model checks share (``Path``, the problems found so far).
- ``model_checks``: ``check_model`` and the checks of one model's fields.
- ``profile_checks``: the checks of one profile, and of its width against its engine.
- ``catalog_checks``: ``check_catalog``, ``Catalog`` and ``build_catalog``.
"""

from __future__ import annotations

from catalog.rules.catalog_checks import Catalog, build_catalog, catalog_warnings, check_catalog
from catalog.rules.constants import (
    CLASS_CRITICAL,
    CLASS_OPPORTUNISTIC,
    CLASS_STANDARD,
    CLASSES,
    DEFAULT_STARTUP_TIMEOUT,
    FACILITY_LEVELS,
    GUARD_FORMATS,
    MAX_PREWARM,
    RESIDENCIES,
    RESIDENCY_LOCAL,
    ROLE_GUARD,
)
from catalog.rules.environment import STRICT, Environment, is_loopback, key_file, url_problem
from catalog.rules.fingerprint import fingerprint
from catalog.rules.found import Path
from catalog.rules.helpers import (
    canary_limits,
    class_rank,
    cpu_capable,
    cpu_only,
    effective_class,
    effective_scale,
    is_external,
    is_guard,
    is_peer,
    kv_index,
    on_demand,
    parse_level,
    profile_by_name,
    repository_page,
    short_revision,
    simulated,
    suggest_cores,
    valid_owner,
)
from catalog.rules.model_checks import check_model
from catalog.rules.normalize import keep_origin, normalize, normalized_profiles
from catalog.rules.schedule import clock, window_at

__all__ = [
    "CLASSES",
    "CLASS_CRITICAL",
    "CLASS_OPPORTUNISTIC",
    "CLASS_STANDARD",
    "DEFAULT_STARTUP_TIMEOUT",
    "FACILITY_LEVELS",
    "GUARD_FORMATS",
    "MAX_PREWARM",
    "RESIDENCIES",
    "RESIDENCY_LOCAL",
    "ROLE_GUARD",
    "STRICT",
    "Catalog",
    "Environment",
    "Path",
    "build_catalog",
    "canary_limits",
    "catalog_warnings",
    "check_catalog",
    "check_model",
    "class_rank",
    "clock",
    "cpu_capable",
    "cpu_only",
    "effective_class",
    "effective_scale",
    "fingerprint",
    "is_external",
    "is_guard",
    "is_loopback",
    "is_peer",
    "key_file",
    "kv_index",
    "keep_origin",
    "normalize",
    "normalized_profiles",
    "on_demand",
    "parse_level",
    "profile_by_name",
    "repository_page",
    "short_revision",
    "simulated",
    "suggest_cores",
    "url_problem",
    "valid_owner",
    "window_at",
]
