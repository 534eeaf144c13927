"""The catalog's forms, shared by the console and the admin.

Fields hold what the files hold, in forms a person types: durations as ``20m``, lists one
item a line (or comma-separated), maps as ``KEY=VALUE`` lines. The rules are not here:
``check_bundle`` builds the model from the form and its formsets and asks
``catalog.services.check_change``, then puts each problem at the field its path names.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

from django import forms
from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from django.forms import BaseInlineFormSet, inlineformset_factory

from agent.engines import ENGINES
from catalog import convert, rules, services, spec
from catalog.durations import DurationError, format_duration, parse_duration
from catalog.models import Adapter, Alias, OriginFile, Profile, ScaleWindow, ServedModel
from catalog.problems import Problem


class GoDurationField(forms.CharField):
    """A duration written as Go writes it (``90s``, ``20m``, ``1h30m``); held as ns."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("required", False)
        kwargs.setdefault("widget", forms.TextInput(attrs={"placeholder": "e.g. 20m"}))
        super().__init__(**kwargs)

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, int):
            return "" if value == 0 else format_duration(value)
        return value

    def to_python(self, value: Any) -> int:  # type: ignore[override]
        text = super().to_python(value)
        if not text:
            return 0
        try:
            return parse_duration(text)
        except DurationError as exc:
            raise ValidationError(str(exc), code="bad_duration") from None


class LinesField(forms.CharField):
    """A list of strings, one a line (or, with ``sep=","``, comma-separated)."""

    def __init__(self, *, sep: str = "\n", **kwargs: Any) -> None:
        self.sep = sep
        kwargs.setdefault("required", False)
        if sep == "\n":
            kwargs.setdefault("widget", forms.Textarea(attrs={"rows": 2}))
        super().__init__(**kwargs)

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, list):
            return (self.sep if self.sep == "\n" else ", ").join(value)
        return value

    def to_python(self, value: Any) -> list[str]:  # type: ignore[override]
        text = super().to_python(value) or ""
        return [part.strip() for part in text.split(self.sep) if part.strip()]


class ArgsField(LinesField):
    """An engine's arguments as an operator pastes them: a command line split as a shell
    splits it (``--n-gpu-layers 0`` is two arguments), on one line or one a line; quotes
    keep spaces inside one argument (``--chat-template 'a b'``). Shown one a line, quoted
    where a shell would need it, so a saved list reads back the same."""

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, list):
            return "\n".join(shlex.quote(v) for v in value)
        return value

    def to_python(self, value: Any) -> list[str]:  # type: ignore[override]
        text = forms.CharField.to_python(self, value) or ""
        out: list[str] = []
        for n, line in enumerate(text.splitlines(), start=1):
            try:
                out += shlex.split(line, comments=False, posix=True)
            except ValueError as exc:  # an unclosed quote
                raise ValidationError(
                    f"line {n}: {exc} ({line.strip()[:80]!r}): close the quote, or write the "
                    "argument without it",
                    code="bad_args",
                ) from None
        return out


class KeyValueField(forms.CharField):
    """A map of strings written ``KEY=VALUE``, one a line."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("required", False)
        kwargs.setdefault("widget", forms.Textarea(attrs={"rows": 2, "placeholder": "KEY=VALUE"}))
        super().__init__(**kwargs)

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, dict):
            return "\n".join(f"{k}={v}" for k, v in sorted(value.items()))
        return value

    def to_python(self, value: Any) -> dict[str, str]:  # type: ignore[override]
        text = super().to_python(value) or ""
        out: dict[str, str] = {}
        for n, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            key, eq, val = line.partition("=")
            if not eq or not key.strip():
                raise ValidationError(
                    f"line {n} ({line.strip()!r}) is not KEY=VALUE: write one pair a line",
                    code="not_key_value",
                )
            if key.strip() in out:
                raise ValidationError(
                    f"{key.strip()} is given twice: keep one", code="duplicate_key"
                )
            out[key.strip()] = val.strip()
        return out


def _suggest(choices: tuple[str, ...] | list[str]) -> forms.Widget:
    # A text box with suggestions rather than a select: an unknown value must reach the
    # rules, which say what is wrong in the same words everywhere.
    return forms.TextInput(attrs={"list": "", "data-suggest": ",".join(choices)})


def _select(choices: list[tuple[str, str]]) -> forms.Select:
    # A select, as the list's filters are; the field stays text, so whatever is posted
    # still reaches the rules and their message (a stored value the choices lack is
    # added to them: ``_keep_value``).
    return forms.Select(choices=choices)


def _keep_value(form: forms.BaseForm, name: str) -> None:
    """Add the form's value of a select to its choices when they lack it."""
    field = form.fields.get(name)
    if field is None or not isinstance(field.widget, forms.Select):
        return
    value = form.data.get(form.add_prefix(name)) if form.is_bound else form.initial.get(name)
    known = {str(v) for v, _ in field.widget.choices}
    if value not in (None, "") and str(value) not in known:
        field.widget.choices = [*field.widget.choices, (value, value)]


ROLE_CHOICES = [("", "serve (answers requests)"), (rules.ROLE_GUARD, "guard (a judge)")]
CLASS_CHOICES = [("", "unset")] + [(c, c) for c in rules.CLASSES]
RESIDENCY_CHOICES = [("", "may cross to a federated peer"),
                     (rules.RESIDENCY_LOCAL, "local (never to a federated peer)")]  # fmt: skip
ENGINE_CHOICES = [("", "choose…")] + [(e, e) for e in ENGINES]


# Column prefixes that stand for a block of the file: scaling_min is scaling.min.
_BLOCKS = (
    "origin_previous",
    "scaling",
    "external",
    "canary",
    "eval",
    "slo",
    "capabilities",
    "guard",
    "origin",
)
_KEY_RENAMES = {"capacity_class": "class", "from_time": "from", "to_time": "to"}


def file_key(field_name: str) -> str:
    """Return the catalog file's key for a form field: ``scaling_min`` is ``scaling.min``."""
    if field_name in _KEY_RENAMES:
        return _KEY_RENAMES[field_name]
    for block in _BLOCKS:
        if field_name.startswith(block + "_"):
            return block.replace("_", ".") + "." + field_name[len(block) + 1 :]
    return field_name


class BlankNumbersAreZero(forms.ModelForm):  # type: ignore[type-arg]
    """Read an emptied number box as 0, as a file that leaves the key out does.

    Every field is labelled with the file's key (``scaling.min``, ``gpu_class``, ``tp``),
    the words the rules' messages and the catalog files use, on every surface (console
    and admin) and whatever the form has been through (a refused save re-renders it).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name, field in self.fields.items():
            field.label = file_key(name)
            if isinstance(field, forms.IntegerField | forms.FloatField):
                field.required = False

    # Numbers whose empty box means a default other than 0, as a file leaving them out.
    BLANK_DEFAULTS: dict[str, float] = {"cached_token_weight": 1.0}

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        for name, field in self.fields.items():
            if (
                isinstance(field, forms.IntegerField | forms.FloatField)
                and data.get(name, 0) is None
            ):
                data[name] = self.BLANK_DEFAULTS.get(name, 0)
        return data


class ServedModelForm(BlankNumbersAreZero):
    """A catalog model's own fields; its profiles and other rows are formsets."""

    scaling_idle_timeout = GoDurationField(label="scaling.idle_timeout")
    scaling_prewarm = GoDurationField(label="scaling.prewarm")
    slo_ttft_p99 = GoDurationField(label="slo.ttft_p99")
    slo_tpot_p99 = GoDurationField(label="slo.tpot_p99")
    fallbacks = LinesField(sep=",", label="fallbacks", help_text="In order, comma-separated.")
    guard_categories = LinesField(label="guard.categories", help_text="One a line.")

    class Meta:
        model = ServedModel
        fields = (
            "name", "description", "source",
            "scaling_min", "scaling_max", "scaling_idle_timeout", "scaling_prewarm",
            "capacity_class", "owner", "role", "trust_remote_code", "residency", "guard_format",
            "guard_categories",
            "fallbacks", "overflow", "max_loaded_adapters", "context_length", "max_output",
            "cached_token_weight",
            "capabilities_tools", "capabilities_vision", "capabilities_embeddings",
            "capabilities_rerank",
            "routing_profile", "slo_ttft_p99", "slo_tpot_p99",
            "external_url", "external_model", "external_api_key_file", "external_peer",
            "canary_model", "canary_percent", "canary_min_requests",
            "canary_max_error_increase", "canary_max_ttft_ratio",
            "eval_suite", "eval_min_score", "eval_judge",
            "origin_repo", "origin_revision", "origin_previous_source",
            "origin_previous_revision",
        )  # fmt: skip
        widgets = {
            "description": forms.Textarea(attrs={"rows": 2}),
            "capacity_class": _select(CLASS_CHOICES),
            "role": _select(ROLE_CHOICES),
            "residency": _select(RESIDENCY_CHOICES),
            "guard_format": _suggest(rules.GUARD_FORMATS),
        }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The bundle (this form and its formsets) is checked as a whole by check_bundle.
        self.instance.checked_as_bundle = True
        for name in ("scaling_min", "scaling_max"):  # checked as typed, as a window's
            if name in self.fields:
                self.fields[name].widget.attrs["class"] = "check-typed"
        # Missing values are the rules' to report, in their words (read-only views of
        # the admin have no fields at all).
        for name in ("name", "source"):
            if name in self.fields:
                self.fields[name].required = False
        for name in ("capacity_class", "role", "residency"):
            _keep_value(self, name)


class UnsetIsOne(forms.NumberInput):
    """A width (tp, pp, nodes) whose 0 means unset, which the rules read as 1.

    Shown empty with 1 as its placeholder rather than as a 0 the rules do not mean; an
    empty box is read as 0 (``BlankNumbersAreZero``), so what is stored is unchanged.
    """

    def __init__(self, attrs: dict[str, Any] | None = None) -> None:
        super().__init__({"placeholder": "1", **(attrs or {})})

    def format_value(self, value: Any) -> str | None:
        if value in (0, "0"):
            return None
        return super().format_value(value)  # type: ignore[no-any-return]


# A profile's class and width: one rule (tp x pp = nodes x gpus_per_node) and one fit on
# the cluster's free cards tie them together, so they are checked, and shown, as one.
WIDTH_FIELDS = ("gpu_class", "tp", "pp", "gpus_per_node", "nodes")


class ProfileForm(BlankNumbersAreZero):
    """One profile: engine, cards, parallelism, arguments and limits."""

    args = ArgsField(
        help_text="As on a command line (--n-gpu-layers 0), on one line or one argument a line."
    )
    env = KeyValueField()
    node_selector = KeyValueField()
    startup_timeout = GoDurationField()

    class Meta:
        model = Profile
        fields = (
            "name", "engine", "engine_version", "gpu_class", "tp", "pp", "gpus_per_node",
            "nodes", "args", "env", "min_memory_gb", "cpu_cores", "min_disk_gb",
            "node_selector", "power_watts", "keep_within", "weight", "capacity", "priority",
            "startup_timeout", "kv_events",
        )  # fmt: skip
        widgets = {
            "engine": _select(ENGINE_CHOICES),
            "keep_within": _suggest(rules.FACILITY_LEVELS),
            "tp": UnsetIsOne(),
            "pp": UnsetIsOne(),
            "nodes": UnsetIsOne(),
        }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.instance.checked_as_bundle = True
        _keep_value(self, "engine")
        # Checked as typed (the form page's trigger on .check-typed): the fields of a
        # profile's width, and its class, whose fit on the cluster shows beside it.
        for name in WIDTH_FIELDS:
            self.fields[name].widget.attrs["class"] = "check-typed"
        self.fields["gpu_class"].widget.attrs.update(
            {"list": "gpu-class-options", "autocomplete": "off"}
        )


class WindowForm(BlankNumbersAreZero):
    """One schedule window: days, from, to, min and max."""

    days = LinesField(
        sep=",",
        help_text="mon … sun, weekdays, weekends; empty is every day.",
        widget=forms.TextInput(attrs={"placeholder": "every day"}),
    )

    class Meta:
        model = ScaleWindow
        fields = ("days", "from_time", "to_time", "min", "max")
        widgets = {
            "from_time": forms.TextInput(attrs={"placeholder": "08:00"}),
            "to_time": forms.TextInput(attrs={"placeholder": "18:00"}),
        }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.instance.checked_as_bundle = True
        # Checked as typed (the model form's .check-typed trigger): a min above max
        # says so before max is left.
        for name in ("min", "max"):
            self.fields[name].widget.attrs["class"] = "check-typed"
            # A new window's boxes start empty, showing 0: a prefilled 0 typed into became
            # "05". Blank is read as 0 (BlankNumbersAreZero), as the placeholder says.
            if self.instance.pk is None and not self.is_bound:
                self.initial.pop(name, None)
                self.fields[name].initial = None
                self.fields[name].widget.attrs["placeholder"] = "0"


class ScheduleForm(BlankNumbersAreZero):
    """A model's scaling as the schedule editor changes it: min, max and prewarm.

    Its windows are the ``windows`` formset; everything else stays as stored. Checked
    as a bundle, like the model form (``check_bundle``).
    """

    scaling_prewarm = GoDurationField(label="scaling.prewarm")

    class Meta:
        model = ServedModel
        fields = ("scaling_min", "scaling_max", "scaling_prewarm")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.instance.checked_as_bundle = True


class _ChildForm(BlankNumbersAreZero):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.instance.checked_as_bundle = True


class AdapterForm(_ChildForm):
    """One LoRA adapter."""

    class Meta:
        model = Adapter
        fields = ("name", "source", "scale")


class AliasForm(_ChildForm):
    """One alias."""

    class Meta:
        model = Alias
        fields = ("name",)


class OriginFileForm(_ChildForm):
    """One weights file of the origin (or of origin.previous)."""

    class Meta:
        model = OriginFile
        fields = ("previous", "path", "sha256", "bytes")


class OrderedInlineFormSet(BaseInlineFormSet):  # type: ignore[type-arg]
    """Rows kept in the order shown; a blank extra row is not a row."""

    def live_forms(self) -> list[forms.ModelForm]:  # type: ignore[type-arg]
        """Return the forms that are rows after saving, in order."""
        out = []
        for form in self.forms:
            if not hasattr(form, "cleaned_data"):
                continue
            if self.can_delete and form.cleaned_data.get("DELETE"):
                continue
            if form.instance.pk is None and not form.has_changed():
                continue
            out.append(form)
        return out


def _formset(model: type[Any], form: type[Any]) -> Any:
    return inlineformset_factory(
        ServedModel, model, form=form, formset=OrderedInlineFormSet, extra=0, can_delete=True
    )


FORMSETS: dict[str, Any] = {
    "profiles": _formset(Profile, ProfileForm),
    "windows": _formset(ScaleWindow, WindowForm),
    "adapters": _formset(Adapter, AdapterForm),
    "aliases": _formset(Alias, AliasForm),
    "origin_files": _formset(OriginFile, OriginFileForm),
}


def build_formsets(
    data: Mapping[str, Any] | None, instance: ServedModel
) -> dict[str, OrderedInlineFormSet]:
    """Return the model's formsets, bound to ``data`` when given, prefixed by group."""
    return {group: cls(data, instance=instance, prefix=group) for group, cls in FORMSETS.items()}


def bundle_spec(form: ServedModelForm, formsets: Mapping[str, OrderedInlineFormSet]) -> spec.Model:
    """Return the model the (valid) form and formsets describe."""
    children = {}
    for group, fs in formsets.items():
        rows = [f.instance for f in fs.live_forms()]
        if group == "origin_files":
            rows.sort(key=lambda r: bool(r.previous))
        children[group] = rows
    return convert.spec_from_instance(form.instance, children)


def attach_problems(
    problems: list[Problem],
    form: forms.BaseForm,
    formsets: Mapping[str, OrderedInlineFormSet],
) -> None:
    """Put each problem at the field its path names: on the form, or a formset's row."""
    for p in problems:
        loc = convert.locate(p.path)
        if loc.group is None:
            field = loc.field if loc.field in form.fields else None
            message = p.message if field else f"{p.field}: {p.message}"
            form.add_error(field, ValidationError(message, code=p.code))
            continue
        fs = formsets.get(loc.group)
        if fs is None:
            form.add_error(None, ValidationError(f"{p.field}: {p.message}", code=p.code))
            continue
        rows = fs.live_forms()
        if loc.group == "origin_files":
            rows = [f for f in rows if bool(f.instance.previous) == loc.previous]
        if loc.index is not None and loc.index < len(rows):
            row = rows[loc.index]
            field = loc.field if loc.field in row.fields else None
            message = p.message if field else f"{p.field}: {p.message}"
            row.add_error(field, ValidationError(message, code=p.code))
        else:
            fs._non_form_errors.append(  # type: ignore[union-attr]
                ValidationError(p.message, code=p.code)
            )


def check_bundle(
    form: ServedModelForm,
    formsets: Mapping[str, OrderedInlineFormSet],
    replacing: str | None,
) -> spec.Model | None:
    """Validate the form and formsets and the rules over them; return the model or None.

    Shape errors (a duration without a unit, a line that is not KEY=VALUE) come first;
    only a well-formed bundle is checked against the catalog's rules, whose problems are
    then attached at their fields.
    """
    valid = form.is_valid()
    # Every formset is validated (no short circuit), so every row shows its errors.
    formsets_valid = [fs.is_valid() for fs in formsets.values()]
    valid = all(formsets_valid) and valid
    if not valid:
        return None
    model = bundle_spec(form, formsets)
    problems = services.check_change(model, replacing)
    if problems:
        attach_problems(problems, form, formsets)
        return None
    return model


def error_map(
    form: forms.BaseForm, formsets: Mapping[str, OrderedInlineFormSet]
) -> dict[str, list[str]]:
    """Return every error by the HTML name of its field (``profiles-0-tp``), for htmx.

    Non-field errors are under ``__all__`` (the model) or ``<group>-__all__``.
    """
    out: dict[str, list[str]] = {}
    for field, errors in form.errors.items():
        key = "__all__" if field == NON_FIELD_ERRORS else form.add_prefix(field)
        out.setdefault(key, []).extend(errors)
    for group, fs in formsets.items():
        for row in fs.forms:
            for field, errors in row.errors.items():
                key = (
                    f"{row.prefix}-__all__" if field == NON_FIELD_ERRORS else row.add_prefix(field)
                )
                out.setdefault(key, []).extend(errors)
        if fs.is_bound and fs.non_form_errors():
            out.setdefault(f"{group}-__all__", []).extend(fs.non_form_errors())
    return out
