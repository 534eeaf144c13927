"""After every health probe of a judge, a sample of how it is doing, for its chart.

``guard.services.probe_judges`` saves each judge's ``JudgeProbe``; the receiver here
keeps a ``JudgeSample`` of it with the judge's answers, failures and decisions so far
(two queries and an insert a judge a probe, every ``LLMGW_PROBE_INTERVAL`` seconds).
Connected in ``GuardConfig.ready``.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Sum
from django.db.models.signals import post_save

from guard.models import JudgeDecision, JudgeHealth, JudgeProbe, JudgeSample

# Samples kept a judge: at the default one a minute, about four days.
KEEP = 6000


def record_sample(probe: JudgeProbe) -> JudgeSample:
    """Keep a sample of a judge from its latest probe and its counts so far."""
    health = (
        JudgeHealth.objects.filter(judge=probe.judge).values("answers", "failures").first() or {}
    )
    verdicts = dict(
        JudgeDecision.objects.filter(judge=probe.judge)
        .values("verdict")
        .annotate(n=Sum("count"))
        .values_list("verdict", "n")
    )
    sample = JudgeSample.objects.create(
        judge=probe.judge,
        at=probe.at,
        ok=probe.ok,
        latency_ms=probe.latency_ms,
        ordinary_verdict=probe.ordinary_verdict,
        harmful_verdict=probe.harmful_verdict,
        error=probe.error[:2000],
        answers=health.get("answers", 0),
        failures=health.get("failures", 0),
        safe=verdicts.get("safe", 0) or 0,
        unsafe=verdicts.get("unsafe", 0) or 0,
        controversial=verdicts.get("controversial", 0) or 0,
    )
    # Every hundredth sample, the oldest beyond KEEP go.
    if sample.pk % 100 == 0:
        cutoff = (
            JudgeSample.objects.filter(judge=probe.judge)
            .order_by("-at", "-id")
            .values_list("at", flat=True)[KEEP : KEEP + 1]
        )
        for at in cutoff:
            JudgeSample.objects.filter(judge=probe.judge, at__lte=at).delete()
    return sample


def _probe_saved(sender: Any, instance: JudgeProbe, **kwargs: Any) -> None:
    record_sample(instance)


def connect() -> None:
    """Connect the receivers (``GuardConfig.ready``)."""
    post_save.connect(_probe_saved, sender=JudgeProbe, dispatch_uid="guard-judge-sample")
