"""What the mirror holds and is fetching, and what the last update checks found.

``Fetch`` is a row per model and revision asked for: queued, fetching (with bytes done of
the total), done (its files in the mirror's folder ``folder``), failed (with the reason),
or dropped (its files deleted: neither the model's current nor its previous revision).
``UpdateCheck`` is the last check of each model (``updates.check``'s result, kept).
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

from catalog.choices import Surface


class FetchState(models.TextChoices):
    """Where a fetch into the mirror is."""

    QUEUED = "queued", _("queued")
    FETCHING = "fetching", _("fetching")
    DONE = "done", _("done")
    FAILED = "failed", _("failed")
    DROPPED = "dropped", _("dropped")


ACTIVE = (FetchState.QUEUED, FetchState.FETCHING)


class Fetch(models.Model):
    """A model's files at one revision, fetched into the mirror once for every node."""

    model = models.CharField(max_length=200, db_index=True, help_text=_("the catalog model"))
    source = models.CharField(max_length=2000, help_text=_("a repository id or an http(s) URL"))
    revision = models.CharField(
        max_length=200, blank=True, help_text=_("as asked: a commit, a branch; empty: the newest")
    )
    commit = models.CharField(
        max_length=200, blank=True, help_text=_("the commit the files were fetched at")
    )
    state = models.CharField(max_length=20, choices=FetchState.choices, default=FetchState.QUEUED)
    bytes_done = models.BigIntegerField(default=0)
    bytes_total = models.BigIntegerField(null=True, blank=True)
    files = models.JSONField(
        default=list, blank=True, help_text=_("every file: path, sha256, bytes")
    )
    folder = models.CharField(
        max_length=1000, blank=True, help_text=_("where the files are, under LLMGW_MIRROR_DIR")
    )
    reason = models.TextField(blank=True)
    requested_by = models.CharField(max_length=300, blank=True)
    surface = models.CharField(max_length=20, blank=True)
    created = models.DateTimeField(auto_now_add=True)
    started = models.DateTimeField(null=True, blank=True)
    finished = models.DateTimeField(null=True, blank=True)
    # Moved on at each step of a fetch: a "fetching" row left unmoved was being fetched
    # by a worker that died, and is taken up again (``updates.mirror.resume_stale``).
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ("-created", "-id")
        constraints = [
            models.UniqueConstraint(
                fields=("model", "source", "revision"),
                condition=Q(state__in=("queued", "fetching")),
                name="updates_fetch_one_active",
                violation_error_message="this model is being fetched at that revision already",
            )
        ]

    def __str__(self) -> str:
        return f"{self.model} @ {self.commit[:8] or self.revision or 'newest'} ({self.state})"

    @property
    def fraction(self) -> float | None:
        """Return how much of it is fetched, 0 to 1, or None when its size is unknown."""
        if self.state == FetchState.DONE:
            return 1.0
        if not self.bytes_total:
            return None
        return min(1.0, self.bytes_done / self.bytes_total)

    def as_json(self) -> dict[str, object]:
        """Return the fetch as the API and the agents see it."""
        return {
            "id": self.pk,
            "model": self.model,
            "source": self.source,
            "revision": self.revision,
            "commit": self.commit,
            "state": self.state,
            "bytes_done": self.bytes_done,
            "bytes_total": self.bytes_total,
            "reason": self.reason,
            "requested_by": self.requested_by,
            "created": self.created.isoformat() if self.created else None,
            "finished": self.finished.isoformat() if self.finished else None,
        }


class UpdateCheck(models.Model):
    """A model's last update check: what ``catalog update check --json`` printed of it."""

    model = models.CharField(max_length=200, unique=True)
    state = models.CharField(max_length=20)  # current / available / error
    revision = models.CharField(max_length=200, blank=True)
    latest = models.CharField(max_length=200, blank=True)
    changed = models.JSONField(default=list, blank=True)
    added = models.JSONField(default=list, blank=True)
    removed = models.JSONField(default=list, blank=True)
    message = models.TextField(blank=True)
    checked = models.DateTimeField()
    checked_by = models.CharField(max_length=300, blank=True)

    class Meta:
        ordering = ("model",)

    def __str__(self) -> str:
        return f"{self.model}: {self.state}"

    def as_json(self) -> dict[str, object]:
        """Return the check as the command's ``--json`` line (and when it was made)."""
        return {
            "model": self.model,
            "state": self.state,
            "revision": self.revision,
            "latest": self.latest,
            "changed": list(self.changed),
            "added": list(self.added),
            "removed": list(self.removed),
            "message": self.message,
            "checked": self.checked.isoformat(),
        }


# -- the update flow's records (updates.run drives them, updates.flow decides) -------------


class UpdateState(models.TextChoices):
    """Where an update is: running a step, waiting for promote by hand, or ended."""

    RUNNING = "running", _("running")
    WAITING = "waiting", _("ready to promote")
    PROMOTED = "promoted", _("promoted")
    FAILED = "failed", _("failed")


class UpdateRun(models.Model):
    """One update of a model to new weights: its steps, what each found, who started it.

    ``plan`` is ``updates.flow.Plan`` as it started (the steps, the canary's settings, the
    eval gate, ``auto``); ``lines`` a progress line per step as it went (each
    ``{"at", "step", "text"}``); ``failed_cases`` the eval's failed cases (``{"case",
    "answer", "why"}``); ``canary`` the canary's figures (``{"percent", "served",
    "min_requests", "why"}``). At most one update a model is running or waiting.
    """

    model = models.CharField(max_length=200, db_index=True)
    candidate = models.CharField(max_length=200, blank=True)
    revision = models.CharField(max_length=200, blank=True, help_text=_("as asked"))
    commit = models.CharField(max_length=200, blank=True, help_text=_("the new revision"))
    from_commit = models.CharField(max_length=200, blank=True, help_text=_("the one replaced"))
    state = models.CharField(
        max_length=20, choices=UpdateState.choices, default=UpdateState.RUNNING
    )
    step = models.CharField(max_length=20, default="fetch")
    plan = models.JSONField(default=dict, blank=True)
    lines = models.JSONField(default=list, blank=True)
    fetch_id = models.BigIntegerField(null=True, blank=True)
    score = models.FloatField(null=True, blank=True)
    threshold = models.FloatField(null=True, blank=True)
    eval_total = models.PositiveIntegerField(default=0)
    eval_done = models.PositiveIntegerField(default=0)
    eval_passed = models.PositiveIntegerField(default=0)
    eval_started = models.DateTimeField(null=True, blank=True)
    eval_key = models.CharField(max_length=100, blank=True)
    failed_cases = models.JSONField(default=list, blank=True)
    canary = models.JSONField(default=dict, blank=True)
    canary_started = models.DateTimeField(null=True, blank=True)
    canary_reached = models.DateTimeField(null=True, blank=True)
    # After a promote, the roll's replacements: until each is ready (or failed, or gone)
    # the candidate is the model's first fallback, taking its traffic while it has no
    # ready replica; ``handover_ended`` when that was taken off.
    handover = models.JSONField(default=list, blank=True)
    handover_ended = models.DateTimeField(null=True, blank=True)
    reason = models.TextField(blank=True)
    started_by = models.CharField(max_length=300, blank=True)
    surface = models.CharField(max_length=20, blank=True)
    ended_by = models.CharField(max_length=300, blank=True)
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)
    finished = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ("-created", "-id")
        constraints = [
            models.UniqueConstraint(
                fields=("model",),
                condition=Q(state__in=("running", "waiting")),
                name="updates_updaterun_one_active",
                violation_error_message="an update of this model is running already",
            )
        ]

    def __str__(self) -> str:
        return f"update #{self.pk} of {self.model} ({self.state}, {self.step})"

    @property
    def started_through(self) -> str:
        """Return who started it and through what, once: ``alice (console)``, ``alice (api,
        token ci)``, ``system (ops@host) (command line)`` (the label names the surface
        already but from the command line, where it names the account)."""
        who = self.started_by or "the system"
        if not self.surface or self.surface in who:
            return who
        try:
            through = str(Surface(self.surface).label)
        except ValueError:
            through = self.surface
        return f"{who} ({through})"

    @property
    def active(self) -> bool:
        """Return whether the update has not ended."""
        return self.state in (UpdateState.RUNNING, UpdateState.WAITING)
