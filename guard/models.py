"""What the guard keeps: the policy (and its changes), each judge's health and decisions."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class GuardPolicy(models.Model):
    """The policy in force: one row, its data as ``guard.policy.to_data`` writes it."""

    data = models.JSONField()
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = "guard policy"
        verbose_name_plural = "guard policy"  # there is one

    def __str__(self) -> str:
        return f"guard policy ({self.updated:%Y-%m-%d %H:%M})"


class PolicyChange(models.Model):
    """One change of the policy: who, when, through what, before and after."""

    at = models.DateTimeField(auto_now_add=True, db_index=True)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    actor_name = models.CharField(max_length=200)
    surface = models.CharField(max_length=20)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField()
    summary = models.TextField(blank=True)

    class Meta:
        ordering = ("-at", "-id")

    def __str__(self) -> str:
        return f"policy changed by {self.actor_name}"


class JudgeHealth(models.Model):
    """How a judge has been doing: answers, failures, the last error, latency."""

    judge = models.CharField(max_length=200, unique=True)
    answers = models.BigIntegerField(default=0)
    failures = models.BigIntegerField(default=0)
    last_error = models.TextField(blank=True)
    last_error_kind = models.CharField(max_length=40, blank=True)
    last_error_at = models.DateTimeField(null=True, blank=True)
    last_good_at = models.DateTimeField(null=True, blank=True)
    last_latency_ms = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ("judge",)
        verbose_name_plural = "judge health"

    def __str__(self) -> str:
        return self.judge


class JudgeBreaker(models.Model):
    """A judge's circuit breaker as one process last had it (``guard.breaker``).

    Each gateway process (the web process's, each ``gateway serve``) keeps its own
    breakers in memory and writes each change of state here off the request path, for
    the console; nothing reads it to decide. ``process`` is ``host:pid``; a process that
    starts deletes the rows of processes of its host no longer running.
    """

    judge = models.CharField(max_length=200)
    process = models.CharField(max_length=200)
    state = models.CharField(max_length=20)
    since = models.DateTimeField(null=True, blank=True)
    opened_at = models.DateTimeField(null=True, blank=True)
    next_probe = models.DateTimeField(null=True, blank=True)
    backoff = models.FloatField(default=0)
    failures = models.IntegerField(default=0)
    last_kind = models.CharField(max_length=40, blank=True)
    updated = models.DateTimeField()

    class Meta:
        ordering = ("judge", "process")
        constraints = [
            models.UniqueConstraint(
                fields=["judge", "process"], name="%(app_label)s_%(class)s_unique_key"
            )
        ]

    def __str__(self) -> str:
        return f"{self.judge} in {self.process}: {self.state}"


class JudgeDecision(models.Model):
    """How many times a judge gave a verdict with a category (empty for none)."""

    judge = models.CharField(max_length=200)
    verdict = models.CharField(max_length=20)
    category = models.CharField(max_length=200, blank=True)
    count = models.BigIntegerField(default=0)

    class Meta:
        ordering = ("judge", "verdict", "category")
        constraints = [
            models.UniqueConstraint(
                fields=["judge", "verdict", "category"],
                name="%(app_label)s_%(class)s_unique_key",
            )
        ]

    def __str__(self) -> str:
        return f"{self.judge} {self.verdict} {self.category}: {self.count}"


class JudgeProbe(models.Model):
    """The last health probe of a judge: an ordinary and a harmful text, and how it went."""

    judge = models.CharField(max_length=200, unique=True)
    at = models.DateTimeField()
    ok = models.BooleanField(default=False)
    ordinary_verdict = models.CharField(max_length=20, blank=True)
    harmful_verdict = models.CharField(max_length=20, blank=True)
    latency_ms = models.FloatField(null=True, blank=True)
    error = models.TextField(blank=True)

    class Meta:
        ordering = ("judge",)

    def __str__(self) -> str:
        return f"{self.judge} probed at {self.at}"


class JudgeSample(models.Model):
    """A judge as one health probe found it: latency, verdicts, and the counts so far.

    Written after every probe (``guard.signals``), for the chart of latency and verdicts
    over time on the judge's page: ``answers``, ``failures`` and the ``safe``,
    ``unsafe`` and ``controversial`` decisions are the judge's totals then, so the
    difference between two samples is what happened between them.
    """

    judge = models.CharField(max_length=200)
    at = models.DateTimeField()
    ok = models.BooleanField(default=False)
    latency_ms = models.FloatField(null=True, blank=True)
    ordinary_verdict = models.CharField(max_length=20, blank=True)
    harmful_verdict = models.CharField(max_length=20, blank=True)
    error = models.TextField(blank=True)
    answers = models.BigIntegerField(default=0)
    failures = models.BigIntegerField(default=0)
    safe = models.BigIntegerField(default=0)
    unsafe = models.BigIntegerField(default=0)
    controversial = models.BigIntegerField(default=0)

    class Meta:
        ordering = ("judge", "at", "id")
        indexes = [models.Index(fields=["judge", "at"], name="guard_sample_judge_at")]

    def __str__(self) -> str:
        return f"{self.judge} at {self.at}"


class EvalRun(models.Model):
    """One evaluation of judges on a labelled set (``guard eval``): what, who, when."""

    class Status(models.TextChoices):
        RUNNING = "running", "running"
        DONE = "done", "done"
        FAILED = "failed", "failed"

    started = models.DateTimeField(db_index=True)
    finished = models.DateTimeField(null=True, blank=True)
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.RUNNING)
    error = models.TextField(blank=True)
    set_name = models.CharField(max_length=200)
    set_description = models.TextField(blank=True)
    set_source = models.CharField(max_length=500)
    set_digest = models.CharField(max_length=64)
    texts = models.PositiveIntegerField(default=0)
    judges = models.JSONField(default=list)
    controversial = models.CharField(max_length=20, default="safe")
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    actor_name = models.CharField(max_length=200)
    surface = models.CharField(max_length=20)

    class Meta:
        ordering = ("-started", "-id")

    def __str__(self) -> str:
        return f"eval {self.pk} of {self.set_name}"


class EvalResult(models.Model):
    """One judge on one text of an evaluation: its verdict and unsafe score, or its failure."""

    run = models.ForeignKey(EvalRun, on_delete=models.CASCADE, related_name="results")
    judge = models.CharField(max_length=200)
    position = models.PositiveIntegerField()
    text = models.TextField()
    # The answer judged (with ``text`` as its request); null when the request was.
    answer = models.TextField(null=True, blank=True)
    label = models.CharField(max_length=20)
    category = models.CharField(max_length=200, blank=True)
    note = models.TextField(blank=True)
    verdict = models.CharField(max_length=20, blank=True)
    categories = models.JSONField(default=list, blank=True)
    score = models.FloatField(null=True, blank=True)
    score_source = models.CharField(max_length=20, blank=True)
    flagged = models.BooleanField(default=False)
    latency_ms = models.FloatField(null=True, blank=True)
    failure_kind = models.CharField(max_length=40, blank=True)
    failure = models.TextField(blank=True)

    class Meta:
        ordering = ("run", "position", "judge")
        constraints = [
            models.UniqueConstraint(
                fields=["run", "judge", "position"], name="%(app_label)s_%(class)s_unique_key"
            )
        ]

    def __str__(self) -> str:
        return f"{self.judge} on text {self.position} of run {self.run_id}"
