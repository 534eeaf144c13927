"""Client keys: what applications send to the gateway, stored hashed."""

from __future__ import annotations

import re
import secrets

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models as db
from django.utils.translation import gettext_lazy as _

from gateway.path.federation import name_problem

# Stored as SHA-256, as API tokens are: 32 random bytes need no salt, and checking one
# stays cheap on every request (the gateway's table holds keys by the same digest).
from gateway.path.table import KEY_PREFIX
from llmgw_core import models as tokens

# peer:NAME: the key of another llmgw cluster that federates this one (docs/federation.md):
# it never sees a residency: local model nor one this cluster learned from a peer.
PEER_OWNER = "peer:"
OWNER_RE = re.compile(r"^(org|team|project|peer):[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
PRIORITIES = [("high", _("high")), ("normal", _("normal")), ("low", _("low"))]
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


def validate_owner(value: str) -> None:
    if value and not OWNER_RE.match(value):
        raise ValidationError(
            _(
                "write the owner as org:NAME, team:NAME or project:NAME (peer:NAME: a federated "
                "cluster's key)"
            ),
            code="owner",
        )


def validate_name(value: str) -> None:
    if not NAME_RE.match(value):
        raise ValidationError(
            _("a key's name is letters, digits, '.', '_' and '-', starting with a letter or digit"),
            code="name",
        )


class ClientKey(tokens.ShownOnce):
    """A named key an application sends to the gateway; shown once, kept hashed."""

    name = db.CharField(_("name"), max_length=100, validators=[validate_name])
    owner = db.CharField(
        _("owner"), max_length=120, blank=True, validators=[validate_owner],
        help_text=_("org:NAME, team:NAME or project:NAME: whose traffic this is; peer:NAME: "
                    "a federated cluster's key (never offered residency: local models)"),
    )  # fmt: skip
    models = db.JSONField(
        _("models"), default=list, blank=True,
        help_text=_("the models, aliases and adapters it may name; empty: every model in the "
                    "cluster (external models only when listed)"),
    )  # fmt: skip
    priority = db.CharField(
        _("priority"), max_length=8, choices=PRIORITIES, default="normal",
        help_text=_("its band when a model is past its latency SLO: high is always admitted, "
                    "normal and low are held back first (docs/gateway.md, Admission)"),
    )  # fmt: skip
    rpm = db.PositiveIntegerField(_("requests per minute"), default=0, help_text=_("0: none"))
    tpm = db.PositiveIntegerField(_("tokens per minute"), default=0, help_text=_("0: none"))
    # Made by the control plane alone (``gateway.services.pinned_key``: the capacity
    # bench), never by a form, the API, the admin or ``gateway key create`` (not editable):
    # the gateway sends such a key's requests to this replica only, never to another, to a
    # canary or a fallback (``gateway.path.routing``). A plain id, not a foreign key: a replica
    # that is gone leaves its key pinned to nothing (503), never free to go anywhere.
    replica = db.PositiveBigIntegerField(
        _("pinned replica"), null=True, blank=True, editable=False,
        help_text=_("the one replica this key's requests go to (the capacity bench's key); "
                    "empty: routed as any key"),
    )  # fmt: skip
    created_by = db.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=db.SET_NULL,
        related_name="+", editable=False,
    )  # fmt: skip

    class Meta:
        ordering = ("name",)
        verbose_name = _("client key")
        constraints = [
            db.UniqueConstraint(
                fields=["name"],
                condition=db.Q(revoked__isnull=True),
                name="%(app_label)s_%(class)s_unique_live_name",
                violation_error_message=_("a live client key already has that name"),
            )
        ]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        if not isinstance(self.models, list) or not all(
            isinstance(m, str) and m for m in self.models
        ):
            raise ValidationError({"models": _("a list of model names")}, code="models")


def new_secret() -> str:
    return f"{KEY_PREFIX}{secrets.token_urlsafe(32)}"


class Usage(db.Model):
    """What the gateway served, per minute, key, owner and model (``gateway.records.usage``).

    Written off the request path in batches by every gateway process, the counts added in
    the database (``count = count + n``): exact with any number of processes.
    """

    minute = db.DateTimeField(_("minute"), help_text=_("the minute's start (UTC)"))
    key = db.CharField(_("key"), max_length=100, help_text=_("the client key's name"))
    owner = db.CharField(_("owner"), max_length=120, blank=True)
    model = db.CharField(_("model"), max_length=200, blank=True,
                         help_text=_("the catalog model that answered"))  # fmt: skip
    requests = db.PositiveBigIntegerField(_("requests"), default=0)
    errors = db.PositiveBigIntegerField(
        _("errors"), default=0, help_text=_("answered with an error (4xx or 5xx), refusals apart")
    )
    tokens_in = db.PositiveBigIntegerField(_("tokens in"), default=0)
    tokens_out = db.PositiveBigIntegerField(_("tokens out"), default=0)
    refusals = db.PositiveBigIntegerField(
        _("refusals"), default=0, help_text=_("refused by the guard (request or answer)")
    )
    tokens_cached = db.PositiveBigIntegerField(
        _("cached tokens"), default=0,
        help_text=_("of the tokens in, those the engine read from its prefix cache"),
    )  # fmt: skip
    batch_requests = db.PositiveBigIntegerField(
        _("batch requests"), default=0,
        help_text=_("of the requests, those a batch's runner sent (the Batch API's lines)"),
    )  # fmt: skip

    class Meta:
        ordering = ("-minute", "key", "model")
        verbose_name = _("usage")
        verbose_name_plural = _("usage")
        constraints = [
            db.UniqueConstraint(
                fields=["minute", "key", "owner", "model"],
                name="%(app_label)s_%(class)s_unique_bucket",
            )
        ]
        indexes = [db.Index(fields=["key", "-minute"]), db.Index(fields=["model", "-minute"])]

    def __str__(self) -> str:
        return f"{self.minute:%Y-%m-%d %H:%M} {self.key} {self.model}"


class Refusal(db.Model):
    """A request or answer the guard refused, by the id its client was given
    (``x-request-id``): what was decided and by whom, never the text (``gateway.records.refusals``).

    Written off the request path in batches by every gateway process; rows older than
    ``LLMGW_GATEWAY_REFUSAL_DAYS`` are deleted by the periodic job
    ``prune-gateway-refusals`` (``gateway.tasks.prune_refusals``).
    """

    class Direction(db.TextChoices):
        REQUEST = "request", _("request")
        ANSWER = "answer", _("answer")

    at = db.DateTimeField(_("at"), help_text=_("when the guard refused it"))
    request_id = db.CharField(
        _("request id"), max_length=40, unique=True,
        help_text=_("the x-request-id the client got, req_…"),
    )  # fmt: skip
    direction = db.CharField(_("direction"), max_length=8, choices=Direction.choices)
    model = db.CharField(_("model"), max_length=200, blank=True,
                         help_text=_("the catalog model that was asked"))  # fmt: skip
    key = db.CharField(_("key"), max_length=100, help_text=_("the client key's name"))
    owner = db.CharField(_("owner"), max_length=120, blank=True)
    judge = db.CharField(_("judge"), max_length=200, blank=True,
                         help_text=_("the judge that decided; empty when none answered"))  # fmt: skip
    verdict = db.CharField(_("verdict"), max_length=40, blank=True)
    categories = db.JSONField(_("categories"), default=list, blank=True)
    score = db.FloatField(_("score"), null=True, blank=True)
    judged = db.BooleanField(
        _("judged"), default=True,
        help_text=_("false: no judge answered and the policy fails closed"),
    )  # fmt: skip
    failures = db.JSONField(
        _("failures"), default=list, blank=True,
        help_text=_("the judges that gave no verdict on the way, each with how it failed "
                    "(timeout, refused, http_error, unreadable, context, no_replica, "
                    "breaker_open): [{judge, kind}]"),
    )  # fmt: skip

    class Meta:
        ordering = ("-at", "-pk")
        verbose_name = _("refusal")
        indexes = [
            db.Index(fields=["-at"], name="gateway_refusal_at_idx"),
            db.Index(fields=["key", "-at"], name="gateway_refusal_key_at_idx"),
            db.Index(fields=["model", "-at"], name="gateway_refusal_model_at_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.request_id} ({self.direction})"


class TrafficPoint(db.Model):
    """A model's traffic over a minute or an hour (``gateway.records.history``): written off the
    request path by every gateway process (added to), minutes summed into hours after
    ``LLMGW_HISTORY_MINUTE_HOURS``, hours deleted after ``LLMGW_HISTORY_HOUR_DAYS``."""

    MINUTE, HOUR = "minute", "hour"

    resolution = db.CharField(
        _("resolution"), max_length=6, choices=[(MINUTE, _("minute")), (HOUR, _("hour"))]
    )
    at = db.DateTimeField(_("at"), help_text=_("the minute's or hour's start (UTC)"))
    model = db.CharField(_("model"), max_length=200)
    requests = db.PositiveBigIntegerField(default=0)
    errors = db.PositiveBigIntegerField(default=0)
    refusals = db.PositiveBigIntegerField(default=0, help_text=_("refused by the guard"))
    held = db.PositiveBigIntegerField(default=0, help_text=_("held back by admission (429)"))
    overflowed = db.PositiveBigIntegerField(
        default=0, help_text=_("held back by admission and sent to the model's overflow")
    )
    tokens_in = db.PositiveBigIntegerField(default=0)
    tokens_out = db.PositiveBigIntegerField(default=0)
    busy_ms = db.PositiveBigIntegerField(
        default=0, help_text=_("request-milliseconds in flight (/ the period: the mean in flight)")
    )
    ttft = db.JSONField(default=list, blank=True,
                        help_text=_("TTFT histogram on gateway.traffic's edges"))  # fmt: skip
    batch_requests = db.PositiveBigIntegerField(
        default=0, help_text=_("of the requests, those a batch's runner sent")
    )

    class Meta:
        ordering = ("-at", "model")
        constraints = [
            db.UniqueConstraint(
                fields=["resolution", "at", "model"], name="%(app_label)s_%(class)s_unique_point"
            )
        ]
        indexes = [db.Index(fields=["model", "at"], name="gateway_trafficpoint_model_at")]

    def __str__(self) -> str:
        return f"{self.model} {self.resolution} {self.at:%Y-%m-%d %H:%M}"


class StoredResponse(db.Model):
    """A response of the Responses API kept for ``previous_response_id`` and
    ``GET /v1/responses/{id}`` (``gateway.stored``): what its conversation needs, scoped to
    the key's owner, so any gateway process can continue it.

    Written off the request path once its answer has ended; read on the path only by a
    request that names it. Kept ``LLMGW_RESPONSES_KEEP`` days, then deleted by the
    periodic job ``prune-stored-responses`` (``gateway.tasks.prune_responses``).
    """

    id = db.CharField(_("id"), max_length=64, primary_key=True, help_text=_("resp_…"))
    owner = db.CharField(_("owner"), max_length=120, blank=True,
                         help_text=_("the owner of the key that made it"))  # fmt: skip
    key = db.CharField(_("key"), max_length=100, help_text=_("the client key's name"))
    model = db.CharField(_("model"), max_length=200)
    created = db.DateTimeField(_("created"))
    session = db.CharField(_("session"), max_length=512, blank=True,
                           help_text=_("the session its conversation keeps"))  # fmt: skip
    response = db.JSONField(_("response"), help_text=_("the response object as answered"))
    input = db.JSONField(_("input"), default=list, help_text=_("its input items"))
    conversation = db.JSONField(
        _("conversation"), default=list,
        help_text=_("the items a later turn continues: the history, its input, its output"),
    )  # fmt: skip

    class Meta:
        ordering = ("-created",)
        indexes = [db.Index(fields=["created"], name="gateway_storedresponse_created")]

    def __str__(self) -> str:
        return self.id


def validate_peer_name(value: str) -> None:
    why = name_problem(value)
    if why:
        raise ValidationError(why, code="name")


class Peer(db.Model):
    """A federated llmgw cluster: its models appear here as NAME/MODEL (``gateway.peers``).

    Its key is a client key of the peer's, kept in a file in ``LLMGW_SECRETS_DIR`` (as an
    external provider's): the file's name is stored, never the key. ``state`` and the
    figures after it are what the last refreshes found (``gateway.path.federation.probed``).
    """

    name = db.CharField(_("name"), max_length=63, unique=True, validators=[validate_peer_name])
    url = db.CharField(_("url"), max_length=500,
                       help_text=_("the peer's address, with or without /v1"))  # fmt: skip
    api_key_file = db.CharField(
        _("key file"), max_length=500,
        help_text=_("a file in LLMGW_SECRETS_DIR holding a client key of the peer's"),
    )  # fmt: skip
    state = db.CharField(_("state"), max_length=10, default="up", editable=False)
    last_error = db.TextField(_("last error"), blank=True, editable=False)
    failures = db.JSONField(default=list, blank=True, editable=False)
    tripped_at = db.FloatField(default=0.0, editable=False)
    passes = db.IntegerField(default=0, editable=False)
    listed = db.JSONField(_("models listed"), default=list, blank=True, editable=False)
    refreshed = db.DateTimeField(_("refreshed"), null=True, blank=True, editable=False)
    created = db.DateTimeField(_("added"), auto_now_add=True)
    created_by = db.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=db.SET_NULL,
        related_name="+", editable=False,
    )  # fmt: skip

    class Meta:
        ordering = ("name",)
        verbose_name = _("federated peer")

    def __str__(self) -> str:
        return self.name
