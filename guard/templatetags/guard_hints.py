"""A judge's hint when it can run nowhere: what it needs, and who answers meanwhile."""

from __future__ import annotations

from django import template

from catalog import rules
from catalog.services import stored_specs
from cluster import hints
from cluster.choices import ReplicaState
from cluster.models import Replica
from guard import policy as policy_rules
from guard.services import current_policy

register = template.Library()


def meanwhile_text(name: str) -> str:
    """Say which of the policy's other judges answers while this one cannot, if any."""
    pol = current_policy()
    if name not in pol.judge_models:
        return "It is not in the guard policy, so nothing waits for it."
    others = [j for j in pol.judge_models if j != name]
    ready = set(
        Replica.objects.filter(
            model_name__in=others, desired=True, state=ReplicaState.READY
        ).values_list("model_name", flat=True)
    )
    answering = [j for j in others if j in ready]
    if answering:
        first = answering[0]
        sim = any(rules.simulated(m) for m in stored_specs(names=[first]))
        what = " (a sim judge: its verdicts show the guard working; they judge nothing)"
        return (
            f"Meanwhile {first} answers{what if sim else ''}: the policy asks its judges "
            "in turn, and the first that answers decides."
        )
    if pol.fail == policy_rules.FAIL_CLOSED:
        return "No other judge of the policy answers meanwhile: texts are refused (fail: closed)."
    return "No other judge of the policy answers meanwhile: texts pass unjudged (fail: open)."


@register.inclusion_tag("cluster/partials/engine_hint.html")
def judge_hint(name: str) -> dict:
    """The engine hint of a judge (``cluster.hints``), with who answers meanwhile."""
    hint = hints.hint_for(name)
    if hint is None:
        return {"hint": None}
    return {"hint": hint, "meanwhile": meanwhile_text(name)}
