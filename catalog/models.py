"""The catalog in the database: models, their profiles, windows, adapters and aliases.

The rows hold exactly what ``catalog.spec`` holds, one column per field, named by the
field's path in the file (``scaling.min`` is ``scaling_min``, ``canary.percent`` is
``canary_percent``), so a rule's path names the column to blame. The rules themselves live
in ``catalog.rules``; ``clean()`` here, the forms, the admin, the API and the file import
all reach them through ``catalog.services``.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models
from django.urls import reverse
from django.utils.translation import gettext_lazy as _

from catalog.choices import ChangeAction, Surface


class ServedModel(models.Model):
    """A model in the catalog: how it can run and how many replicas it should have."""

    name = models.CharField(_("name"), max_length=200, unique=True)
    position = models.PositiveIntegerField(
        default=0, help_text=_("Order in the catalog file; export keeps it.")
    )
    description = models.TextField(_("description"), blank=True)
    source = models.CharField(_("source"), max_length=2000, blank=True)
    scaling_min = models.IntegerField("scaling.min", default=0)
    scaling_max = models.IntegerField("scaling.max", default=0)
    scaling_idle_timeout = models.BigIntegerField("scaling.idle_timeout", default=0)
    scaling_prewarm = models.BigIntegerField("scaling.prewarm", default=0)
    capacity_class = models.CharField("class", max_length=40, blank=True)
    owner = models.CharField(_("owner"), max_length=200, blank=True)
    external_url = models.CharField("external.url", max_length=2000, blank=True)
    external_model = models.CharField("external.model", max_length=200, blank=True)
    external_api_key_file = models.CharField("external.api_key_file", max_length=1000, blank=True)
    external_peer = models.CharField("external.peer", max_length=200, blank=True)
    max_loaded_adapters = models.IntegerField(default=0)
    cached_token_weight = models.FloatField(
        _("cached_token_weight"),
        default=1.0,
        help_text=_(
            "What a token budget charges for a prompt token the engine read from its prefix "
            "cache, 0 to 1: 1 as much as a fresh one, 0.1 a tenth, 0 nothing."
        ),
    )
    trust_remote_code = models.BooleanField(
        _("trust_remote_code"),
        default=False,
        help_text=_(
            "Run the Python files that come with the model (vLLM, SGLang and TensorRT-LLM's "
            "--trust-remote-code). Set it only for a model whose code you have read: a "
            "change to those files counts as an update."
        ),
    )
    residency = models.CharField(
        _("residency"), max_length=20, blank=True,
        help_text=_("local: never offered to a federated peer's key nor sent to a peer "
                    "(docs/federation.md); empty: no such limit"),
    )  # fmt: skip
    fallbacks = models.JSONField(default=list, blank=True)
    overflow = models.CharField(
        _("overflow"), max_length=200, blank=True,
        help_text=_("a model (or alias) a lower band's request goes to while admission holds "
                    "that band back for this one (its TTFT p99 past its slo), instead of 429"),
    )  # fmt: skip
    canary_model = models.CharField("canary.model", max_length=200, blank=True)
    canary_percent = models.IntegerField("canary.percent", default=0)
    canary_min_requests = models.IntegerField("canary.min_requests", default=0)
    canary_max_error_increase = models.FloatField("canary.max_error_increase", default=0)
    canary_max_ttft_ratio = models.FloatField("canary.max_ttft_ratio", default=0)
    eval_suite = models.CharField("eval.suite", max_length=200, blank=True)
    eval_min_score = models.FloatField("eval.min_score", default=0)
    eval_judge = models.CharField("eval.judge", max_length=200, blank=True)
    routing_profile = models.CharField(max_length=200, blank=True)
    slo_ttft_p99 = models.BigIntegerField("slo.ttft_p99", default=0)
    slo_tpot_p99 = models.BigIntegerField("slo.tpot_p99", default=0)
    context_length = models.IntegerField(default=0)
    max_output = models.IntegerField(default=0)
    capabilities_tools = models.BooleanField("capabilities.tools", default=False)
    capabilities_vision = models.BooleanField("capabilities.vision", default=False)
    capabilities_embeddings = models.BooleanField("capabilities.embeddings", default=False)
    capabilities_rerank = models.BooleanField(
        "capabilities.rerank",
        default=False,
        help_text=_("A reranker: the gateway sends it /v1/rerank and /v2/rerank."),
    )
    role = models.CharField(max_length=40, blank=True)
    guard_format = models.CharField("guard.format", max_length=40, blank=True)
    guard_categories = models.JSONField("guard.categories", default=list, blank=True)
    origin_repo = models.CharField("origin.repo", max_length=400, blank=True)
    origin_revision = models.CharField("origin.revision", max_length=200, blank=True)
    origin_previous_source = models.CharField("origin.previous.source", max_length=2000, blank=True)
    origin_previous_revision = models.CharField(
        "origin.previous.revision", max_length=200, blank=True
    )
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ("position", "id")
        verbose_name = _("catalog model")
        verbose_name_plural = _("catalog models")

    def __str__(self) -> str:
        return self.name

    def get_absolute_url(self) -> str:
        return reverse("catalog:servedmodel_detail", args=[self.name])

    def validate_unique(self, exclude: Any = None) -> None:
        """Leave a taken name to the catalog's rules, which say it in their own words."""
        super().validate_unique(exclude={*(exclude or ()), "name"})

    def clean(self) -> None:
        """Check this model, as it would be saved, against every rule of the catalog.

        Rules about its profiles, windows, adapters and aliases run against the rows
        already stored; the forms, admin and API check those rows as they are edited.
        """
        # Imported here: catalog.services imports these models.
        from catalog import services  # noqa: PLC0415

        services.raise_for_instance(self)

    def to_spec(self) -> Any:
        """Return this model, with its related rows, as ``catalog.spec.Model``."""
        # Imported here: catalog.convert imports these models.
        from catalog import convert  # noqa: PLC0415

        return convert.spec_from_instance(self)


class Profile(models.Model):
    """How a model runs on one GPU class, or on CPUs."""

    model = models.ForeignKey(ServedModel, on_delete=models.CASCADE, related_name="profiles")
    position = models.PositiveIntegerField(default=0)
    name = models.CharField(max_length=200, blank=True)
    engine = models.CharField(max_length=40, blank=True)
    engine_version = models.CharField(max_length=100, blank=True)
    gpu_class = models.CharField(max_length=200, blank=True)
    tp = models.IntegerField(default=0)
    pp = models.IntegerField(default=0)
    gpus_per_node = models.IntegerField(default=0)
    nodes = models.IntegerField(default=0)
    args = models.JSONField(default=list, blank=True)
    env = models.JSONField(default=dict, blank=True)
    min_memory_gb = models.IntegerField(default=0)
    cpu_cores = models.IntegerField(default=0)
    min_disk_gb = models.IntegerField(default=0)
    node_selector = models.JSONField(default=dict, blank=True)
    power_watts = models.FloatField(default=0)
    keep_within = models.CharField(max_length=20, blank=True)
    weight = models.FloatField(default=0)
    capacity = models.IntegerField(
        default=0,
        help_text="Requests one replica carries within the slo, as the bench measured it; "
        "0: not measured.",
    )
    priority = models.IntegerField(default=0)
    startup_timeout = models.BigIntegerField(default=0)
    kv_events = models.BooleanField(default=False)

    class Meta:
        ordering = ("position", "id")

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        """Check the model with this profile in it against every rule of the catalog."""
        # Imported here: catalog.services imports these models.
        from catalog import services  # noqa: PLC0415

        services.raise_for_child(self, "profiles")


class ScaleWindow(models.Model):
    """A part of the week with its own min and max replicas."""

    model = models.ForeignKey(ServedModel, on_delete=models.CASCADE, related_name="windows")
    position = models.PositiveIntegerField(default=0)
    days = models.JSONField(default=list, blank=True)
    from_time = models.CharField("from", max_length=20, blank=True)
    to_time = models.CharField("to", max_length=20, blank=True)
    min = models.IntegerField(default=0)
    max = models.IntegerField(default=0)

    class Meta:
        ordering = ("position", "id")
        verbose_name = _("schedule window")

    def __str__(self) -> str:
        days = ",".join(self.days) or "every day"
        return f"{days} {self.from_time}-{self.to_time}"

    def clean(self) -> None:
        """Check the model with this window in its schedule against the rules."""
        # Imported here: catalog.services imports these models.
        from catalog import services  # noqa: PLC0415

        services.raise_for_child(self, "windows")


class Adapter(models.Model):
    """A LoRA adapter served on a model's replicas."""

    model = models.ForeignKey(ServedModel, on_delete=models.CASCADE, related_name="adapters")
    position = models.PositiveIntegerField(default=0)
    name = models.CharField(max_length=200, blank=True)
    source = models.CharField(max_length=2000, blank=True)
    scale = models.FloatField(default=0)

    class Meta:
        ordering = ("position", "id")

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        """Check the model with this adapter against the rules."""
        # Imported here: catalog.services imports these models.
        from catalog import services  # noqa: PLC0415

        services.raise_for_child(self, "adapters")


class Alias(models.Model):
    """Another name clients may use for a model."""

    model = models.ForeignKey(ServedModel, on_delete=models.CASCADE, related_name="aliases")
    position = models.PositiveIntegerField(default=0)
    name = models.CharField(max_length=200)

    class Meta:
        ordering = ("position", "id")
        verbose_name_plural = _("aliases")

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        """Check the model with this alias against the rules."""
        # Imported here: catalog.services imports these models.
        from catalog import services  # noqa: PLC0415

        services.raise_for_child(self, "aliases")


class OriginFile(models.Model):
    """One weights file of a model's origin, or of the origin it replaced."""

    model = models.ForeignKey(ServedModel, on_delete=models.CASCADE, related_name="origin_files")
    previous = models.BooleanField(
        default=False, help_text=_("A file of origin.previous rather than origin.")
    )
    position = models.PositiveIntegerField(default=0)
    path = models.CharField(max_length=1000)
    sha256 = models.CharField(max_length=64, blank=True)
    bytes = models.BigIntegerField(default=0)

    class Meta:
        ordering = ("previous", "position", "id")

    def __str__(self) -> str:
        return self.path


class ChangeRecord(models.Model):
    """One accepted change to the catalog: who, when, through what, before and after.

    ``before`` and ``after`` are the model as its file mapping (``codec.encode_model``),
    or null for a model that did not exist on that side. Used by the model's page, the
    API's change log and revert.
    """

    model_name = models.CharField(max_length=200, db_index=True)
    action = models.CharField(max_length=20, choices=ChangeAction.choices)
    surface = models.CharField(max_length=20, choices=Surface.choices)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    actor_name = models.CharField(max_length=200, help_text=_("Kept when the user is deleted."))
    at = models.DateTimeField(auto_now_add=True, db_index=True)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    summary = models.TextField(blank=True)
    reverts = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ("-at", "-id")
        indexes = [models.Index(fields=["model_name", "-at"])]

    def __str__(self) -> str:
        return f"{self.model_name} {self.action} by {self.actor_name}"
