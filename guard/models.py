"""What the guard keeps: the policy (and its changes), each judge's health and decisions."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class GuardPolicy(models.Model):
    """The policy in force: one row, its data as ``guard.policy.to_data`` writes it."""

    data = models.JSONField()
    updated = models.DateTimeField(auto_now=True)

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
