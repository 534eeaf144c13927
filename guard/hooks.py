"""What the reconciler and the catalog's signals ask of the guard: serve the judges the
policy names (``serve_policy_judges``, on the leader's every tick), warn of a change that
switches off the only judge that answers (``switch_off_warnings``) and refuse one that
takes a judge the policy names out of it (``policy_refusals``). ``guard.signals``
connects them.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import IntegrityError, transaction

from catalog import rules
from catalog.choices import ChangeAction, Surface
from catalog.models import ChangeRecord, ServedModel
from catalog.problems import Problem
from catalog.services import Actor, Refused
from guard import known
from guard import policy as policy_rules
from guard.models import GuardPolicy
from guard.services import current_policy, enable_judge
from guard.snapshots import judges, parse_stored

log = logging.getLogger(__name__)

# Who the change log names for what the leader does on its own.
LEADER = "reconciler"


_leader_warned: dict[str, str] = {}


def serve_policy_judges() -> list[str]:
    """Add to the catalog, and so serve, each known judge the stored policy names and the
    catalog lacks (the reconciler's leader calls it every tick); return the names added.

    Added as ``guard judge enable NAME`` adds it (a CPU llama.cpp profile), logged as
    done by the reconciler with the reason. What ``known.judges_to_add`` decides: a name
    in the catalog is never touched, and a judge an operator deleted after the policy last
    changed stays deleted (the later word wins) until the policy is saved again or the
    judge enabled. Before a policy is stored (``init`` stores the baseline) it adds
    nothing. A judge the catalog refuses (or an operator adds at the same moment) is left
    out and said once in the log: the tick goes on. Two queries when nothing is missing.
    """
    row = GuardPolicy.objects.order_by("pk").values("data", "updated").first()
    if row is None:
        return []
    names = list(parse_stored(row["data"]).judge_models)
    present = set(ServedModel.objects.filter(name__in=names).values_list("name", flat=True))
    missing = [n for n in names if n not in present and n in known.KNOWN]
    if not missing:
        return []
    deletions = dict(
        ChangeRecord.objects.filter(model_name__in=missing, action=ChangeAction.DELETE)
        .order_by("at")
        .values_list("model_name", "at")
    )  # the latest deletion of each
    deleted_since = {n for n, at in deletions.items() if at > row["updated"]}
    added = []
    for name in known.judges_to_add(names, present, deleted_since):
        why = "the guard policy names it" + (
            "; re-added: deleted before the policy last changed" if name in deletions else ""
        )
        try:
            with transaction.atomic():
                enable_judge(
                    name,
                    gpu=False,
                    sim=False,
                    actor=Actor(user=None, surface=Surface.CLI, name=LEADER, via=why),
                )
        except (Refused, ValueError, IntegrityError) as exc:
            if _leader_warned.get(name) != str(exc):
                _leader_warned[name] = str(exc)
                log.warning("the policy names judge %s; adding it was refused: %s", name, exc)
            continue
        _leader_warned.pop(name, None)
        log.info("added judge %s to the catalog: %s", name, why)
        added.append(name)
    for name in sorted(deleted_since - set(present)):
        if _leader_warned.get(name) != "deleted":
            _leader_warned[name] = "deleted"
            log.info(
                "the policy names judge %s, deleted from the catalog since the policy last "
                "changed: left out (guard judge enable %s, or save the policy, to add it)",
                name,
                name,
            )
    return added


def switch_off_warnings(before: Any, after: Any) -> list[str]:
    """Return the warning for a change that switches off (max 0) the only judge of the
    policy that answers: no judge will answer, so the policy's ``fail`` decides every
    check (``catalog.signals.change_warnings``; two queries when it is a policy judge)."""
    if before is None or after is None or after.scaling.max != 0 or before.scaling.max == 0:
        return []
    pol = current_policy()
    if after.name not in pol.judge_models or not pol.directions:
        return []
    if any(j.ref.ready for j in judges(pol.judge_models) if j.name != after.name):
        return []
    what = " and ".join(pol.directions)
    if pol.fail == policy_rules.FAIL_CLOSED:
        then = f"the guard fails closed: every one of the {what} it judges is refused"
    else:
        then = f"the guard fails open: the {what} it judges are allowed unjudged"
    return [
        f"{after.name} was the only judge of the guard policy that answers: switched off, "
        f"no judge answers and {then} (the policy's fail: {pol.fail}). Enable another judge "
        "or give this one a replica again (scaling.max 1)"
    ]


def policy_refusals(before: Any, after: Any) -> list[Problem]:
    """Refuse a catalog change that takes a judge the policy in force names out of it:
    deleted, renamed or no longer role guard (``catalog.signals.change_refusals``; the
    policy is read only when ``before`` is a judge). The judge comes out of the policy
    first (or the policy judges nothing: ``directions: []``), as a model comes out of
    another's fallbacks before it is deleted: else the policy names a judge that is not
    there, and under ``fail: open`` (the default) the cluster stops judging without a
    word."""
    if before is None or before.role != rules.ROLE_GUARD:
        return []
    if after is not None and after.role == rules.ROLE_GUARD and after.name == before.name:
        return []
    pol = current_policy()
    # The policy names judges by their names; one that judges nothing loses nothing.
    if before.name not in pol.judge_models or not pol.directions:
        return []
    if after is None:
        path, what = ("name",), "delete it"
    elif after.role != rules.ROLE_GUARD:
        path, what = ("role",), "change its role"
    else:
        path, what = ("name",), "rename it"
    listed = ", ".join(pol.judge_models)
    return [Problem(path, f'judge "{before.name}" is named by the guard policy (judge.models: '
                    f"{listed}): take it out of the policy first (the Guard page, the API's "
                    f"policy, or manage.py guard policy set; or have it judge nothing), then {what}",
                    "judge_in_policy")]  # fmt: skip
