"""One FilterSet for the catalog list, used by the API and the console's list page."""

from __future__ import annotations

from typing import Any

import django_filters
from django.db.models import Case, CharField, Q, QuerySet, Value, When

from catalog.models import ServedModel


def with_effective_class(qs: QuerySet[ServedModel]) -> QuerySet[ServedModel]:
    """Annotate ``effective_class`` as ``rules.effective_class`` computes it, in SQL.

    Kept in step with the rule by tests/catalog/test_filtersets.py, which compares the two
    over every combination of class, role and scaling.
    """
    return qs.annotate(
        effective_class=Case(
            When(~Q(capacity_class=""), then="capacity_class"),
            When(role="guard", then=Value("critical")),
            When(Q(scaling_min=0, scaling_max__gt=0), then=Value("opportunistic")),
            default=Value("standard"),
            output_field=CharField(),
        )
    )


class ServedModelFilterSet(django_filters.FilterSet):
    """Filter catalog models by role, class, engine, GPU class, owner, on-demand, text."""

    role = django_filters.CharFilter(
        method="filter_role", help_text="guard, or serve for models that serve clients"
    )
    capacity_class = django_filters.CharFilter(
        field_name="effective_class",
        label="class",
        help_text="critical, standard or opportunistic (as the model is treated)",
    )
    engine = django_filters.CharFilter(method="filter_engine")
    gpu_class = django_filters.CharFilter(method="filter_gpu_class")
    owner = django_filters.CharFilter(field_name="owner")
    on_demand = django_filters.BooleanFilter(method="filter_on_demand")
    search = django_filters.CharFilter(method="filter_search", label="search")

    class Meta:
        model = ServedModel
        fields: list[str] = []

    def __init__(self, data: Any = None, *args: Any, **kwargs: Any) -> None:
        # "class" is the catalog's own name for the filter; the form field cannot be.
        if data is not None and "class" in data and "capacity_class" not in data:
            data = data.copy()
            data["capacity_class"] = data.get("class")
        super().__init__(data, *args, **kwargs)

    def filter_role(
        self, qs: QuerySet[ServedModel], name: str, value: str
    ) -> QuerySet[ServedModel]:
        return qs.filter(role="" if value == "serve" else value)

    def filter_engine(
        self, qs: QuerySet[ServedModel], name: str, value: str
    ) -> QuerySet[ServedModel]:
        return qs.filter(profiles__engine=value).distinct()

    def filter_gpu_class(
        self, qs: QuerySet[ServedModel], name: str, value: str
    ) -> QuerySet[ServedModel]:
        return qs.filter(profiles__gpu_class=value).distinct()

    def filter_on_demand(
        self, qs: QuerySet[ServedModel], name: str, value: bool
    ) -> QuerySet[ServedModel]:
        on = Q(scaling_min=0, scaling_max__gt=0)
        return qs.filter(on) if value else qs.exclude(on)

    def filter_search(
        self, qs: QuerySet[ServedModel], name: str, value: str
    ) -> QuerySet[ServedModel]:
        value = value.strip()
        if not value:
            return qs
        return qs.filter(
            Q(name__icontains=value)
            | Q(description__icontains=value)
            | Q(source__icontains=value)
            | Q(aliases__name__icontains=value)
        ).distinct()
