"""The catalog in Django's admin, for bulk edits: the same forms and the same rules.

Saving goes through ``catalog.services.save_model``, as the console and the API do, so
an admin edit is checked against the whole catalog and written to the change log.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.actions import delete_selected as django_delete_selected
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse

from catalog import extensions, services
from catalog import forms as catalog_forms
from catalog.choices import Surface
from catalog.filtersets import with_effective_class
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
from llmgw_core.roles import OPERATOR, RoleAdminMixin


class _Inline(RoleAdminMixin, admin.StackedInline):  # type: ignore[type-arg]
    """A group of a model's rows, each row's fields on a few lines.

    Stacked, not tabular: a profile's twenty fields in one table row made the change page
    4,405 px wide. Labels are the file's keys, as the forms set them (a tabular header
    would capitalise them).
    """

    extra = 0
    formset = catalog_forms.OrderedInlineFormSet


class ProfileInline(_Inline):
    model = Profile
    form = catalog_forms.ProfileForm
    fields = (
        ("name", "engine", "engine_version"),
        ("gpu_class", "tp", "pp", "gpus_per_node", "nodes"),
        ("args", "env", "node_selector"),
        ("min_memory_gb", "cpu_cores", "min_disk_gb", "power_watts"),
        ("keep_within", "weight", "capacity", "priority", "startup_timeout", "kv_events"),
    )


class WindowInline(_Inline):
    model = ScaleWindow
    form = catalog_forms.WindowForm
    fields = (("days", "from_time", "to_time", "min", "max"),)
    verbose_name = "window"
    verbose_name_plural = "windows (scaling.schedule)"


class AdapterInline(_Inline):
    model = Adapter
    form = catalog_forms.AdapterForm
    fields = (("name", "source", "scale"),)


class AliasInline(_Inline):
    model = Alias
    form = catalog_forms.AliasForm
    fields = ("name",)


class OriginFileInline(_Inline):
    model = OriginFile
    form = catalog_forms.OriginFileForm
    fields = (("previous", "path", "sha256", "bytes"),)
    verbose_name_plural = "origin files"


INLINE_GROUPS = {
    ProfileInline: "profiles",
    WindowInline: "windows",
    AdapterInline: "adapters",
    AliasInline: "aliases",
    OriginFileInline: "origin_files",
}


class ClassFilter(admin.SimpleListFilter):
    """Filter by the class a model is treated as (guard models are critical)."""

    title = "class"
    parameter_name = "class"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(c, c) for c in ("critical", "standard", "opportunistic")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value():
            return queryset.filter(effective_class=self.value())
        return queryset


class EngineFilter(admin.SimpleListFilter):
    """Filter by an engine any profile uses."""

    title = "engine"
    parameter_name = "engine"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        engines = Profile.objects.values_list("engine", flat=True).distinct().order_by("engine")
        return [(e, e) for e in engines]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value():
            return queryset.filter(profiles__engine=self.value()).distinct()
        return queryset


class GPUClassFilter(admin.SimpleListFilter):
    """Filter by a GPU class any profile names."""

    title = "gpu_class"
    parameter_name = "gpu_class"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        classes = (
            Profile.objects.exclude(gpu_class="")
            .values_list("gpu_class", flat=True)
            .distinct()
            .order_by("gpu_class")
        )
        return [(c, c) for c in classes]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value():
            return queryset.filter(profiles__gpu_class=self.value()).distinct()
        return queryset


class SetClassForm(admin.helpers.ActionForm):
    """The extra inputs of the bulk actions: a class, or min and max."""

    capacity_class = forms.CharField(required=False, label="class")
    scaling_min = forms.IntegerField(required=False, label="min")
    scaling_max = forms.IntegerField(required=False, label="max")


def _bulk(
    modeladmin: ServedModelAdmin,
    request: HttpRequest,
    queryset: QuerySet[ServedModel],
    change: Any,
    what: str,
) -> None:
    """Apply ``change`` to each selected model's spec; refused ones are reported one by one.

    Each model is checked and saved on its own (against the catalog as it then is), so one
    refused model does not hold back the rest.
    """
    actor = services.Actor(user=request.user, surface=Surface.ADMIN, via="bulk action")
    done = []
    for obj in services.stored_queryset().filter(pk__in=queryset.values("pk")):
        m = obj.to_spec()
        change(m)
        try:
            saved = services.save_model(m, actor, replacing=obj.name)
        except services.Refused as exc:
            for p in exc.problems:
                modeladmin.message_user(
                    request, f"{obj.name}: not changed: {p.field}: {p.message}", messages.ERROR
                )
        else:
            done.append(obj.name)
            for warning in saved.change_warnings:
                modeladmin.message_user(request, warning, messages.WARNING)
    if done:
        modeladmin.message_user(request, f"{what}: {', '.join(done)}", messages.SUCCESS)


@admin.register(ServedModel)
class ServedModelAdmin(RoleAdminMixin, admin.ModelAdmin):  # type: ignore[type-arg]
    """Catalog models with their profiles, windows, adapters and aliases inline."""

    form = catalog_forms.ServedModelForm
    inlines = (AliasInline, ProfileInline, WindowInline, AdapterInline, OriginFileInline)
    list_display = (
        "name",
        "role",
        "effective_class",
        "scaling_min",
        "scaling_max",
        "owner",
        "updated",
    )
    list_filter = (ClassFilter, EngineFilter, GPUClassFilter, "role", "owner")
    search_fields = ("name", "description", "source", "aliases__name")
    action_form = SetClassForm
    actions = ("set_class", "switch_off", "set_min_max", "delete_selected")

    def _get_base_actions(self) -> list[Any]:
        """Return this admin's actions and those the layers above registered
        (``catalog.extensions.ADMIN_ACTIONS``: the updates app's), as one list: each is
        offered and run for the roles its ``permissions`` name, a posted one the user's role
        does not allow answered 403, and one that names no role reported by ``manage.py
        check`` (``RoleAdminMixin``), like this admin's own."""
        actions = list(super()._get_base_actions())
        names = {name for _, name, _ in actions}
        for fn in extensions.ADMIN_ACTIONS:
            got = self.get_action(fn)
            if got is not None and got[1] not in names:
                actions.append(got)
                names.add(got[1])
        return actions

    fieldsets = (
        (None, {"fields": ("name", "description", "source", "trust_remote_code", "residency",
                           "role", "capacity_class", "owner")}),
        ("scaling", {"fields": ("scaling_min", "scaling_max", "scaling_idle_timeout", "scaling_prewarm")}),
        ("serving", {"fields": (
            "fallbacks", "overflow", "max_loaded_adapters", "context_length", "max_output",
            "cached_token_weight",
            "capabilities_tools", "capabilities_vision", "capabilities_embeddings",
            "capabilities_rerank",
            "routing_profile", "slo_ttft_p99", "slo_tpot_p99",
        )}),
        ("guard", {"fields": ("guard_format", "guard_categories")}),
        ("external", {"classes": ("collapse",), "fields": (
            "external_url", "external_model", "external_api_key_file", "external_peer",
        )}),
        ("canary", {"classes": ("collapse",), "fields": (
            "canary_model", "canary_percent", "canary_min_requests",
            "canary_max_error_increase", "canary_max_ttft_ratio",
        )}),
        ("eval", {"classes": ("collapse",), "fields": ("eval_suite", "eval_min_score", "eval_judge")}),
        ("origin", {"classes": ("collapse",), "fields": (
            "origin_repo", "origin_revision", "origin_previous_source", "origin_previous_revision",
        )}),
    )  # fmt: skip

    def get_queryset(self, request: HttpRequest) -> QuerySet[ServedModel]:
        return with_effective_class(super().get_queryset(request))

    @admin.display(description="class", ordering="effective_class")
    def effective_class(self, obj: ServedModel) -> str:
        return getattr(obj, "effective_class", obj.capacity_class)

    # Validation: the form and every inline formset are checked together against the
    # rules (catalog.forms.check_bundle's steps); Django's admin validates the form, then
    # each formset, so the whole check runs in the last formset's clean, when the form
    # (kept by save_form) and every row are known.

    def _create_formsets(self, request: HttpRequest, obj: Any, change: bool) -> Any:
        formsets, inline_instances = super()._create_formsets(request, obj, change)
        groups = {
            INLINE_GROUPS[type(inline)]: fs
            for fs, inline in zip(formsets, inline_instances, strict=True)
        }
        if not formsets:
            return formsets, inline_instances
        last = formsets[-1]
        original_clean = last.clean

        def clean() -> None:
            original_clean()
            form = getattr(request, "_llmgw_form", None)
            if form is None or any(not fs.is_valid() for fs in formsets if fs is not last):
                return
            if any(f.errors for f in last.forms):
                return
            replacing = None
            if obj.pk:
                replacing = (
                    ServedModel.objects.filter(pk=obj.pk).values_list("name", flat=True).first()
                )
            model = catalog_forms.bundle_spec(form, groups)
            problems = services.check_change(model, replacing)
            if problems:
                catalog_forms.attach_problems(problems, form, groups)
                raise forms.ValidationError(
                    "The catalog refuses this change: see the fields marked above.",
                    code="refused",
                )

        last.clean = clean
        return formsets, inline_instances

    def save_form(self, request: HttpRequest, form: Any, change: bool) -> Any:
        request._llmgw_form = form  # type: ignore[attr-defined]
        return form.save(commit=False)

    def save_model(self, request: HttpRequest, obj: ServedModel, form: Any, change: bool) -> None:
        # Written with its rows in save_related, through the service, in one step.
        request._llmgw_replacing = (  # type: ignore[attr-defined]
            ServedModel.objects.filter(pk=obj.pk).values_list("name", flat=True).first()
            if change
            else None
        )

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        groups = {}
        for fs in formsets:
            inline = next(i for i in INLINE_GROUPS if i.model is fs.model)
            groups[INLINE_GROUPS[inline]] = fs
        model = catalog_forms.bundle_spec(form, groups)
        actor = services.Actor(user=request.user, surface=Surface.ADMIN)
        saved = services.save_model(
            model, actor, replacing=getattr(request, "_llmgw_replacing", None), into=form.instance
        )
        for warning in saved.change_warnings:
            self.message_user(request, warning, messages.WARNING)

    def construct_change_message(
        self, request: HttpRequest, form: Any, formsets: Any, add: bool = False
    ) -> Any:
        # The rows were written by the service, not by the formsets, so Django's own
        # summary has nothing to read; the catalog's change log has the before and after.
        return [{"added": {}}] if add else [{"changed": {"fields": sorted(form.changed_data)}}]

    def delete_model(self, request: HttpRequest, obj: ServedModel) -> None:
        actor = services.Actor(user=request.user, surface=Surface.ADMIN)
        try:
            services.delete_model(obj.name, actor)
        except services.Refused as exc:
            for p in exc.problems:
                self.message_user(request, f"{obj.name}: not deleted: {p.message}", messages.ERROR)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[ServedModel]) -> None:
        for obj in queryset:
            self.delete_model(request, obj)

    # Django's delete view and action say "deleted successfully" whatever delete_model
    # did; a refused deletion (a dependent names the model) must say only that.

    def response_delete(self, request: HttpRequest, obj_display: str, obj_id: Any) -> HttpResponse:
        if ServedModel.objects.filter(pk=obj_id).exists():  # refused: the errors are shown
            return HttpResponseRedirect(reverse("admin:catalog_servedmodel_change", args=[obj_id]))
        return super().response_delete(request, obj_display, obj_id)

    @admin.action(permissions=["delete"], description="Delete selected catalog models")
    def delete_selected(
        self, request: HttpRequest, queryset: QuerySet[ServedModel]
    ) -> HttpResponse | None:
        """Django's own action (its confirmation page), reporting only what was deleted."""
        if not request.POST.get("post"):
            return django_delete_selected(self, request, queryset)  # type: ignore[no-any-return]
        names = list(queryset.values_list("name", flat=True))
        self.delete_queryset(request, queryset)
        left = set(ServedModel.objects.filter(name__in=names).values_list("name", flat=True))
        deleted = [n for n in names if n not in left]
        if deleted:
            self.message_user(
                request,
                f"Deleted {len(deleted)} catalog model{'s' if len(deleted) != 1 else ''}: "
                f"{', '.join(deleted)}.",
                messages.SUCCESS,
            )
        return None

    @admin.action(
        permissions=[OPERATOR], description="Set class of selected models (class box above)"
    )
    def set_class(self, request: HttpRequest, queryset: QuerySet[ServedModel]) -> None:
        value = (request.POST.get("capacity_class") or "").strip()

        def change(m: Any) -> None:
            m.class_ = value

        _bulk(self, request, queryset, change, f"class set to {value or '(default)'}")

    @admin.action(permissions=[OPERATOR], description="Switch off selected models (min 0, max 0)")
    def switch_off(self, request: HttpRequest, queryset: QuerySet[ServedModel]) -> None:
        def change(m: Any) -> None:
            m.scaling.min, m.scaling.max = 0, 0

        _bulk(self, request, queryset, change, "switched off")

    @admin.action(
        permissions=[OPERATOR],
        description="Set min/max of selected models (min and max boxes above)",
    )
    def set_min_max(self, request: HttpRequest, queryset: QuerySet[ServedModel]) -> None:
        raw_min = request.POST.get("scaling_min", "")
        raw_max = request.POST.get("scaling_max", "")
        try:
            lo = int(raw_min) if raw_min.strip() else None
            hi = int(raw_max) if raw_max.strip() else None
        except ValueError:
            self.message_user(request, "min and max are whole numbers", messages.ERROR)
            return
        if lo is None and hi is None:
            self.message_user(request, "give min, max or both in the boxes above", messages.ERROR)
            return

        def change(m: Any) -> None:
            if lo is not None:
                m.scaling.min = lo
            if hi is not None:
                m.scaling.max = hi

        _bulk(self, request, queryset, change, f"min/max set ({raw_min or '-'}/{raw_max or '-'})")


@admin.register(ChangeRecord)
class ChangeRecordAdmin(RoleAdminMixin, admin.ModelAdmin):  # type: ignore[type-arg]
    """The change log: read only; revert from the console or the API."""

    list_display = ("at", "model_name", "action", "surface", "actor_name", "summary")
    list_filter = ("action", "surface")
    search_fields = ("model_name", "actor_name")
    change_role = None


__all__ = ("ServedModelAdmin", "Problem")
