"""Catalog operations that span rows and the change log: check, save, delete, import, revert.

Every surface goes through here, so every change is checked by ``catalog.rules`` against
the catalog as it would be after the change, written all at once, and logged with who made
it. Used by the API, the console, the admin, the management commands and ``Model.clean``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from django.conf import settings
from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from django.db import connection, transaction
from django.db.models import Max

from catalog import codec, convert, rules, signals, spec
from catalog.choices import ChangeAction, Surface
from catalog.models import (
    Adapter,
    Alias,
    ChangeRecord,
    OriginFile,
    Profile,
    ScaleWindow,
    ServedModel,
)
from catalog.problems import Problem
from llmgw_core import refused

CHILD_MODELS: dict[str, type[Any]] = {
    "profiles": Profile,
    "windows": ScaleWindow,
    "adapters": Adapter,
    "aliases": Alias,
    "origin_files": OriginFile,
}


class Refused(refused.Refused):
    """A change the rules refuse; nothing was written. ``problems`` says why."""

    detail = "the catalog refuses this change"

    def __init__(self, problems: Sequence[Problem]) -> None:
        super().__init__("; ".join(p.line() for p in problems))
        self.problems = list(problems)


@dataclass(frozen=True)
class Actor:
    """Who makes a change, and through what: written into the change log."""

    user: Any
    surface: str
    via: str = ""
    name: str = ""

    @property
    def label(self) -> str:
        """Return the name the change log shows: ``alice``, ``alice (token ci)``."""
        name = getattr(self.user, "username", "") or self.name or "system"
        return f"{name} ({self.via})" if self.via else name


SYSTEM = Actor(user=None, surface=Surface.CLI)


def environment() -> rules.Environment:
    """What this installation allows that the rules depend on, from the settings: the
    secrets folder key files live in, the hosts a provider may be reached at over plain
    http (``catalog.rules.environment``). Every surface's check passes it."""
    return rules.Environment(
        secrets_dir=settings.LLMGW_SECRETS_DIR,
        http_hosts=frozenset(settings.LLMGW_EXTERNAL_HTTP_HOSTS),
    )


def stored_queryset() -> Any:
    """Return every stored model with its related rows fetched in a fixed few queries."""
    return ServedModel.objects.prefetch_related(*convert.CHILD_GROUPS)


def stored_specs(
    exclude_pk: int | None = None, names: Iterable[str] | None = None
) -> list[spec.Model]:
    """Return the stored catalog (or the models named) as specs, in catalog order.

    Read as plain rows (six queries), not model instances with prefetched relations:
    every change is checked against the whole catalog, and building a thousand models'
    related managers cost most of a second (bench/catalog.py).
    """
    qs = ServedModel.objects.order_by("position", "id")
    if exclude_pk is not None:
        qs = qs.exclude(pk=exclude_pk)
    if names is not None:
        qs = qs.filter(name__in=list(names))
    rows = list(qs.values())
    ids = [row["id"] for row in rows] if names is not None else None
    children: dict[str, dict[int, list[SimpleNamespace]]] = {}
    for group, model_cls in CHILD_MODELS.items():
        by_model: dict[int, list[SimpleNamespace]] = defaultdict(list)
        order = (
            ("model_id", "previous", "position", "id")
            if group == "origin_files"
            else ("model_id", "position", "id")
        )
        child_rows = model_cls.objects.order_by(*order)
        if ids is not None:
            child_rows = child_rows.filter(model_id__in=ids)
        for row in child_rows.values():
            by_model[row["model_id"]].append(SimpleNamespace(**row))
        children[group] = by_model
    return [
        convert.spec_from_instance(
            SimpleNamespace(pk=row["id"], **row),
            {group: children[group].get(row["id"], []) for group in CHILD_MODELS},
        )
        for row in rows
    ]


# Where each related group's rows sit in a model as written, and their fields' names there.
_GROUP_PATHS: dict[str, tuple[str, ...]] = {
    "profiles": ("profiles",),
    "windows": ("scaling", "schedule"),
    "adapters": ("adapters",),
    "aliases": ("aliases",),
    "origin_files": ("origin", "files"),
}
_WRITTEN_AS = {"from_time": "from", "to_time": "to"}


def _column_path(field: Any) -> tuple[str, ...]:
    """A column's path in a model as written: its verbose name when it names one."""
    name = str(field.verbose_name)
    if name != field.name.replace("_", " "):
        return tuple(name.split("."))
    return (_WRITTEN_AS.get(field.name, field.name),)


def _unstorable(value: Any, field: Any, path: tuple[Any, ...]) -> Problem | None:
    """Why ``value`` cannot be stored in ``field``'s column, if it cannot."""

    if isinstance(value, str):
        if "\x00" in value:
            message = "contains a NUL character (\\u0000), which cannot be stored: remove it"
            return Problem(path, message, "nul")
        limit = getattr(field, "max_length", None)
        if limit and len(value) > limit:
            return Problem(
                path, f"{len(value)} characters is too long: at most {limit}", "too_long"
            )
    elif isinstance(value, int) and not isinstance(value, bool) and field is not None:
        kind = field.get_internal_type()
        low, high = connection.ops.integer_field_range(kind) if "Integer" in kind else (None, None)
        if (low is not None and value < low) or (high is not None and value > high):
            return Problem(path, f"{value} is out of range: {low} to {high}", "out_of_range")
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            found = _unstorable(item, None, (*path, i))
            if found:
                return found
    elif isinstance(value, dict):
        for key, item in value.items():
            found = _unstorable(key, None, path) or _unstorable(item, None, (*path, key))
            if found:
                return found
    return None


def storage_problems(m: spec.Model) -> list[Problem]:
    """Return what in ``m`` its columns cannot hold: text over a column's length or with a
    NUL character, a whole number beyond the column's range.

    The rules know nothing of columns (``catalog.rules`` is pure); a value they accept may
    still not fit (a name of 5,000 characters, ``scaling.max: 2147483648``). Checked before
    any write, so such a change is refused naming the field, like any other.
    """
    problems = []
    for name, value in convert.instance_values(m).items():
        field = ServedModel._meta.get_field(name)
        found = _unstorable(value, field, _column_path(field))
        if found:
            problems.append(found)
    for group, rows in convert.child_values(m).items():
        fields = CHILD_MODELS[group]._meta
        for i, row in enumerate(rows):
            for name, value in row.items():
                field = fields.get_field(name)
                found = _unstorable(value, field, (*_GROUP_PATHS[group], i, *_column_path(field)))
                if found:
                    problems.append(found)
    return [Problem(p.path, p.message, p.code, model=m.name) for p in problems]


def check_change(
    new: spec.Model | None,
    replacing: str | None = None,
    *,
    current: list[spec.Model] | None = None,
) -> list[Problem]:
    """Return the problems of the catalog with ``new`` in place of ``replacing``.

    ``new`` None deletes ``replacing``. Problems of other models that the change causes
    (a fallback or canary that no longer resolves) are reported against the changed
    model's name, naming the model that depends on it, since that is what the person
    making the change must act on.
    """
    if new is not None:
        unstorable = storage_problems(new)
        if unstorable:
            return unstorable
    before = stored_specs() if current is None else current
    after: list[spec.Model] = []
    index = None
    refusals: list[Problem] = []
    for m in before:
        if replacing is not None and m.name == replacing:
            # What the layers above refuse of it (a judge their policy names).
            refusals = signals.refusals_for(m, new)
            if new is not None:
                index = len(after)
                after.append(new)
        else:
            after.append(m)
    if new is not None and index is None:
        index = len(after)
        after.append(new)
    problems = rules.check_catalog(after, environment())
    own = [p for p in problems if p.index == index]
    own += [Problem(p.path, p.message, p.code, model=replacing, index=index) for p in refusals]
    others = [p for p in problems if p.index != index]
    if not others:
        return own
    subject = replacing or (new.name if new else "")
    catalog = rules.Catalog([rules.normalize(m) for m in before]) if replacing else None
    depends = dict(catalog.dependents(subject)) if catalog else {}
    for p in others:
        how = depends.get(p.model)
        if how:
            message = (
                f'model "{p.model}" names "{subject}" in its {how}: '
                f"change {p.model} first, or keep this name"
            )
            code = "in_use"
        else:
            message = f'model "{p.model}" would be refused: {p.field}: {p.message}'
            code = p.code
        own.append(Problem(("name",), message, code, model=subject, index=index))
    # One line per distinct problem: several fallbacks of one model naming this one
    # say the same thing.
    seen: set[tuple[Any, ...]] = set()
    unique = []
    for p in own:
        key = (p.path, p.message)
        if key not in seen:
            seen.add(key)
            unique.append(p)
    return unique


def problems_to_error(problems: Iterable[Problem], group: str | None = None) -> ValidationError:
    """Return a ValidationError keyed by the column each problem names.

    With ``group``, problems about that child group are keyed by the child's column and
    everything else goes to the non-field errors, as ``Model.clean`` of a child row needs.
    """
    errors: dict[str, list[ValidationError]] = {}
    for p in problems:
        loc = convert.locate(p.path)
        key = NON_FIELD_ERRORS
        if (
            group is None
            and loc.group is None
            and loc.field
            or group is not None
            and loc.group == group
            and loc.field
        ):
            key = loc.field
        message = p.message if key != NON_FIELD_ERRORS or not p.field else f"{p.field}: {p.message}"
        errors.setdefault(key, []).append(ValidationError(message, code=p.code))
    return ValidationError(errors)


def raise_for_instance(instance: ServedModel) -> None:
    """Raise ValidationError if this row, as it would be saved, breaks a rule.

    A form that edits the model together with its related rows marks the instance
    ``checked_as_bundle`` and checks the whole bundle itself (``catalog.forms``).
    """
    if getattr(instance, "checked_as_bundle", False):
        return
    stored_name = None
    if instance.pk is not None:
        stored_name = (
            ServedModel.objects.filter(pk=instance.pk).values_list("name", flat=True).first()
        )
    problems = check_change(instance.to_spec(), stored_name)
    if problems:
        raise problems_to_error(problems)


def raise_for_child(child: Any, group: str) -> None:
    """Raise ValidationError if the model, with this child row in it, breaks a rule.

    Only problems about this row are raised here, keyed by its columns; the model's own
    problems are the model's ``clean()``'s to report.
    """
    if getattr(child, "checked_as_bundle", False):
        return
    parent = getattr(child, "model", None) if child.model_id else None
    if parent is None:
        return
    rows = list(getattr(parent, group).exclude(pk=child.pk)) if parent.pk else []
    position = len(rows)
    for i, row in enumerate(rows):
        if (row.position, row.pk) > (child.position, child.pk or 0):
            position = i
            break
    rows.insert(position, child)
    if group == "origin_files":
        rows.sort(key=lambda r: r.previous)
    new = convert.spec_from_instance(parent, {group: rows})
    problems = [
        p
        for p in check_change(new, parent.name if parent.pk else None)
        if convert.locate(p.path).group == group
        and convert.locate(p.path).index in (position, None)
    ]
    if problems:
        raise problems_to_error(problems, group=group)


def _log(
    name: str,
    action: str,
    actor: Actor,
    before: spec.Model | None,
    after: spec.Model | None,
    reverts: ChangeRecord | None = None,
    note: str = "",
) -> ChangeRecord:
    b = codec.encode_model(before) if before is not None else None
    a = codec.encode_model(after) if after is not None else None
    # Every logged change is one the layers above act on (the reconciler ticks): they
    # hear of it once this commits (catalog.signals).
    signals.changed([name])
    return ChangeRecord.objects.create(
        model_name=name,
        action=action,
        surface=actor.surface,
        actor=actor.user if getattr(actor.user, "pk", None) else None,
        actor_name=actor.label,
        before=b,
        after=a,
        summary=f"{summarize(b, a)}: {note}" if note else summarize(b, a),
        reverts=reverts,
    )


def summarize(before: Any, after: Any) -> str:
    """Return the top-level keys that differ, as a short line for lists."""
    if before is None:
        return "created"
    if after is None:
        return "deleted"
    keys = [k for k in {**before, **after} if before.get(k) != after.get(k)]
    return ", ".join(keys) if keys else "no change"


def _write(instance: ServedModel, m: spec.Model) -> ServedModel:
    for key, value in convert.instance_values(m).items():
        setattr(instance, key, value)
    new = instance.pk is None
    if new:
        top = ServedModel.objects.aggregate(top=Max("position"))["top"]
        instance.position = 0 if top is None else top + 1
    instance.save()
    for group, values in convert.child_values(m).items():
        model_cls = CHILD_MODELS[group]
        if not new:
            model_cls.objects.filter(model=instance).delete()
        model_cls.objects.bulk_create(
            model_cls(model=instance, position=i, **v) for i, v in enumerate(values)
        )
    # The prefetch cache, if any, no longer holds what was written.
    getattr(instance, "_prefetched_objects_cache", {}).clear()
    return instance


def _create_many(models: list[spec.Model], actor: Actor) -> None:
    """Write new models in a few bulk statements, with their change-log entries.

    An import of a thousand new models is one insert per table rather than a dozen
    statements a model (bench/catalog.py).
    """
    if not models:
        return
    signals.changed(m.name for m in models)  # logged below, in bulk
    top = ServedModel.objects.aggregate(top=Max("position"))["top"]
    start = 0 if top is None else top + 1
    rows = ServedModel.objects.bulk_create(
        ServedModel(position=start + i, **convert.instance_values(m)) for i, m in enumerate(models)
    )
    for group, model_cls in CHILD_MODELS.items():
        model_cls.objects.bulk_create(
            model_cls(model=row, position=i, **v)
            for row, m in zip(rows, models, strict=True)
            for i, v in enumerate(convert.child_values(m)[group])
        )
    ChangeRecord.objects.bulk_create(
        ChangeRecord(
            model_name=m.name,
            action=ChangeAction.CREATE,
            surface=actor.surface,
            actor=actor.user if getattr(actor.user, "pk", None) else None,
            actor_name=actor.label,
            before=None,
            after=codec.encode_model(m),
            summary="created",
        )
        for m in models
    )


@transaction.atomic
def save_model(
    new: spec.Model,
    actor: Actor,
    replacing: str | None = None,
    *,
    into: ServedModel | None = None,
    note: str = "",
) -> ServedModel:
    """Check and write a model (a new one, or in place of ``replacing``), and log it.

    ``note`` is added to the change log's summary: why the change was made (the gateway's
    canary rollback writes its figures there).

    Raises Refused, writing nothing, when the catalog after the change breaks a rule.
    ``into`` is the row object to write (the admin's own instance, so it learns its pk).
    The row's ``change_warnings`` are what the layers above warn of about the change
    (``catalog.signals.change_warnings``; none when nothing changed): surfaces show them.
    """
    instance = None
    before = None
    if replacing is not None:
        instance = stored_queryset().select_for_update().filter(name=replacing).first()
        if instance is not None and into is not None:
            into.pk = instance.pk
            into.position = instance.position
            into.created = instance.created
            before = instance.to_spec()
            instance = into
        elif instance is not None:
            before = instance.to_spec()
        if instance is None:
            raise Refused(
                [Problem(("name",), f'model "{replacing}" is not in the catalog', "not_found")]
            )
    elif into is not None:
        instance = into
    problems = check_change(new, replacing)
    if problems:
        raise Refused(problems)
    normalized = rules.normalize(new)
    if before is not None and codec.encode_model(before) == codec.encode_model(normalized):
        instance.change_warnings = []  # type: ignore[union-attr,attr-defined]
        return instance  # type: ignore[return-value]
    instance = _write(instance or ServedModel(), normalized)
    instance.checked_as_bundle = True
    action = ChangeAction.CREATE if before is None else ChangeAction.UPDATE
    _log(normalized.name, action, actor, before, normalized, note=note)
    instance.change_warnings = signals.warnings_for(before, normalized) + [  # type: ignore[attr-defined]
        p.message for p in rules.catalog_warnings([normalized])
    ]
    return instance


@transaction.atomic
def set_measured(name: str, profile: str, weight: float, capacity: int, actor: Actor,
                 note: str) -> ServedModel:  # fmt: skip
    """Write a profile's measured ``weight`` and ``capacity`` (the capacity bench's), with
    ``note`` (the figures) in the change log; refused, writing nothing, when the model or
    the profile is not in the catalog or the figures break a rule."""
    row = stored_queryset().filter(name=name).first()
    if row is None:
        raise Refused([Problem(("name",), f'model "{name}" is not in the catalog', "not_found")])
    m = row.to_spec()
    target = next((p for p in m.profiles if p.name == profile), None)
    if target is None:
        names = ", ".join(p.name for p in m.profiles) or "none"
        raise Refused([Problem(("profiles",), f'model "{name}" has no profile "{profile}" '
                               f"(its profiles: {names})", "not_found")])  # fmt: skip
    target.weight = weight
    target.capacity = capacity
    return save_model(m, actor, replacing=name, note=note)


def reference_specs() -> list[spec.Model]:
    """Return every model with only what names other models: aliases, fallbacks, canary,
    overflow.

    Two queries whatever the catalog's size, and enough for ``rules.Catalog.dependents``:
    a model's page asks it on every view.
    """
    aliases: dict[int, list[str]] = {}
    for model_id, alias in Alias.objects.order_by("model_id", "position", "id").values_list(
        "model_id", "name"
    ):
        aliases.setdefault(model_id, []).append(alias)
    out = []
    for pk, name, fallbacks, canary, overflow in ServedModel.objects.values_list(
        "pk", "name", "fallbacks", "canary_model", "overflow"
    ):
        out.append(
            spec.Model(
                name=name,
                aliases=aliases.get(pk, []),
                fallbacks=list(fallbacks or []),
                canary=spec.Canary(model=canary) if canary else None,
                overflow=overflow,
            )
        )
    return out


def delete_blockers(name: str) -> list[tuple[str, str]]:
    """Return (model, how) for each model whose fallbacks, canary or overflow name this one."""
    return rules.Catalog(reference_specs()).dependents(name)


@transaction.atomic
def delete_model(name: str, actor: Actor) -> None:
    """Delete a model and log it; refused while another model depends on it."""
    instance = stored_queryset().select_for_update().filter(name=name).first()
    if instance is None:
        raise Refused([Problem(("name",), f'model "{name}" is not in the catalog', "not_found")])
    problems = check_change(None, name)
    if problems:
        raise Refused(problems)
    before = instance.to_spec()
    instance.delete()
    _log(name, ChangeAction.DELETE, actor, before, None)


@dataclass
class ImportResult:
    """What an import did (or, dry, would do)."""

    added: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)


def _import_problems(
    models: list[spec.Model], kept: list[spec.Model], removed: dict[str, spec.Model]
) -> list[Problem]:
    """Return the problems of the catalog an import leaves: the kept models, then the file's.

    The kept models come first, so a clash between one and the file (an alias both claim,
    a canary both name) is reported at the file's model, at its position in the file:
    the file is what the operator is changing. A kept model's own problem (a fallback
    the file takes away) has no position and names the model. A reference that resolves
    only to a model ``--replace`` removes (``removed``: the stored models the file does
    not list) says so.
    """
    gone = rules.Catalog([rules.normalize(m) for m in removed.values()])
    out = []
    for p in rules.check_catalog([*kept, *models], environment()):
        if p.index is None or p.index < len(kept):
            out.append(Problem(p.path, p.message, p.code, model=p.model))
            continue
        i = p.index - len(kept)
        message = p.message
        ref = _reference(models[i], p)
        target = gone.resolve(ref) if ref else None
        if target is not None:
            what = {"unknown_fallback": "fallback", "unknown_overflow": "overflow"}.get(
                p.code, "canary"
            )
            named = f'"{ref}"' if ref == target.name else f'"{ref}" (an alias of "{target.name}")'
            message = (
                f"{what} {named} is removed by --replace, as the file does not list "
                f'"{target.name}": add it to the file, or name a model the file lists'
            )
        out.append(Problem(p.path, message, p.code, model=p.model, index=i))
    return out


def _reference(m: spec.Model, p: Problem) -> str:
    """Return the name an unresolved fallback or canary problem is about, or ""."""
    if p.code == "unknown_fallback" and len(p.path) == 2 and isinstance(p.path[1], int):
        return m.fallbacks[p.path[1]]
    if p.code == "unknown_canary" and m.canary is not None:
        return m.canary.model
    if p.code == "unknown_overflow":
        return m.overflow
    return ""


@transaction.atomic
def import_catalog(
    models: list[spec.Model], actor: Actor, *, replace: bool = False, dry_run: bool = False
) -> ImportResult:
    """Import a file's models all at once: added, changed and (with replace) removed.

    The catalog after the import is checked as a whole first: the file's models together
    with the stored models the import keeps (none with ``replace``), so a file's fallbacks
    and canaries may name a stored model or its alias. One problem and nothing is written
    (raises Refused with every problem; the file's models' at their positions in the file).
    """
    # Lock the catalog's rows for the import's length: two imports at once must not
    # each pass the rules against a catalog the other is changing.
    list(ServedModel.objects.select_for_update().values_list("pk", flat=True))
    stored = {m.name: m for m in stored_specs()}
    incoming = {m.name for m in models}
    kept = [] if replace else [m for n, m in stored.items() if n not in incoming]
    removed = {n: m for n, m in stored.items() if n not in incoming} if replace else {}
    problems = _import_problems(models, kept, removed) + [
        Problem(p.path, p.message, p.code, model=p.model, index=i)
        for i, m in enumerate(models)
        for p in storage_problems(m)
    ]
    # What the layers above refuse (a judge their policy names): of a model the file
    # changes, at its position; of one --replace removes, by its name.
    for i, m in enumerate(models):
        if m.name in stored:
            problems += [Problem(p.path, p.message, p.code, model=m.name, index=i)
                         for p in signals.refusals_for(stored[m.name], m)]  # fmt: skip
    for name, gone in removed.items():
        problems += [Problem(p.path, p.message, p.code, model=name)
                     for p in signals.refusals_for(gone, None)]  # fmt: skip
    if problems:
        raise Refused(problems)
    result = ImportResult()
    added: list[spec.Model] = []
    for m in models:
        before = stored.get(m.name)
        # A file leaves the origin out (the mirror writes it): the recorded one stays.
        normalized = rules.normalize(rules.keep_origin(m, before))
        if before is None:
            result.added.append(m.name)
            added.append(normalized)
        elif codec.encode_model(before) == codec.encode_model(normalized):
            result.unchanged.append(m.name)
        else:
            result.changed.append(m.name)
            if not dry_run:
                _write(ServedModel.objects.get(name=m.name), normalized)
                _log(m.name, ChangeAction.UPDATE, actor, before, normalized)
    if replace:
        for name, before in stored.items():
            if name in incoming:
                continue
            result.removed.append(name)
            if not dry_run:
                ServedModel.objects.filter(name=name).delete()
                _log(name, ChangeAction.DELETE, actor, before, None)
    if not dry_run:
        _create_many(added, actor)
    if replace and not dry_run:
        # The file's order is the catalog's order from now on.
        order = {m.name: i for i, m in enumerate(models)}
        for pk, name, position in ServedModel.objects.values_list("pk", "name", "position"):
            if position != order[name]:
                ServedModel.objects.filter(pk=pk).update(position=order[name])
    return result


@transaction.atomic
def revert_change(record: ChangeRecord, actor: Actor) -> ChangeRecord:
    """Put a model back as it was before a change, if the catalog then passes the rules.

    Reverting a creation deletes the model; reverting a deletion recreates it; reverting
    an update restores the before side (under its old name, replacing the model as it is
    now, whatever it is called).
    """
    target_name = record.model_name
    if record.after is not None:
        target_name = record.after.get("name", record.model_name)
    current = ServedModel.objects.filter(name=target_name).first()
    before_now = current.to_spec() if current else None
    if record.before is None:
        if current is None:
            raise Refused(
                [Problem(("name",), f'model "{target_name}" is already gone', "not_found")]
            )
        problems = check_change(None, target_name)
        if problems:
            raise Refused(problems)
        current.delete()
        return _log(target_name, ChangeAction.REVERT, actor, before_now, None, reverts=record)
    restored, decode_problems = codec.decode_model(record.before)
    if decode_problems or restored is None:
        raise Refused(decode_problems)
    problems = check_change(restored, target_name if current else None)
    if problems:
        raise Refused(problems)
    normalized = rules.normalize(restored)
    _write(current or ServedModel(), normalized)
    return _log(normalized.name, ChangeAction.REVERT, actor, before_now, normalized, reverts=record)


def export_specs() -> list[spec.Model]:
    """Return the catalog to export, in catalog order."""
    return stored_specs()
