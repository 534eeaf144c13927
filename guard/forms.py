"""The policy as a form: the console's Guard page and the Django admin edit it with this.

Every check is ``guard.services.prepare_policy``'s (``guard.policy.validate`` and
``complete``), the one the API and ``guard policy set`` use: the form only turns its
fields into the policy's data (one judge or category a line) and puts each problem at
the field it is about, naming the line for a list's item. The
choice fields take any text, so a wrong value gets the policy's own message rather
than Django's.
"""

from __future__ import annotations

from typing import Any

from django import forms

from catalog.problems import PathPart
from guard import policy as policy_rules
from guard import services

CONTROVERSIAL_CHOICES = [
    ("safe", "safe: a Controversial verdict allows (the default)"),
    ("unsafe", "unsafe: a Controversial verdict counts as Unsafe"),
]
FAIL_CHOICES = [
    ("open", "open: allow when every judge failed (the default)"),
    ("closed", "closed: refuse when every judge failed"),
]
DIRECTION_CHOICES = [
    ("requests", "requests (what clients ask)"),
    ("answers", "answers (what models answer)"),
]


class ListField(forms.Field):
    """A list of texts (checkboxes), passed on as it came for the policy to check."""

    def to_python(self, value: Any) -> list[str]:
        if value in (None, ""):
            return []
        if isinstance(value, str):
            return [value]
        return [str(v) for v in value]


def lines_of(text: str) -> tuple[list[str], list[int]]:
    """Return the non-blank lines of a text, stripped, and each one's line number."""
    items: list[str] = []
    numbers: list[int] = []
    for number, line in enumerate((text or "").splitlines(), start=1):
        if line.strip():
            items.append(line.strip())
            numbers.append(number)
    return items, numbers


# Where each of the policy's keys is edited.
FIELD_OF_KEY = {
    ("judge", "models"): "judge_models",
    ("judge", "controversial"): "controversial",
    ("fail",): "fail",
    ("directions",): "directions",
    ("categories",): "categories",
}


class PolicyForm(forms.Form):
    """The guard policy's fields; ``clean`` checks them with ``services.prepare_policy``.

    After ``is_valid()``, ``policy`` is the policy as it will be saved (completed for
    its judges), ``policy_data`` the data to pass to ``guard.services.save_policy`` and
    ``notes`` what completing it changed.
    """

    judge_models = forms.CharField(
        label="judge.models",
        required=False,
        strip=False,
        widget=forms.Textarea(attrs={"rows": 4, "spellcheck": "false"}),
        help_text="The judges, one a line, in the order they are asked; the first that "
        "answers decides.",
    )
    controversial = forms.CharField(
        label="judge.controversial",
        required=False,
        widget=forms.RadioSelect(choices=CONTROVERSIAL_CHOICES),
        help_text="How a Qwen3Guard Controversial verdict counts.",
    )
    fail = forms.CharField(
        label="fail",
        required=False,
        widget=forms.RadioSelect(choices=FAIL_CHOICES),
        help_text="What decides when every judge failed.",
    )
    directions = ListField(
        label="directions",
        required=False,
        widget=forms.CheckboxSelectMultiple(choices=DIRECTION_CHOICES),
        help_text="What is judged; none judges nothing while keeping the policy.",
    )
    categories = forms.CharField(
        label="categories",
        required=False,
        strip=False,
        widget=forms.Textarea(attrs={"rows": 9, "spellcheck": "false"}),
        help_text="The categories that refuse, one a line. An unsafe verdict refuses when "
        "it names one of these, or names none.",
    )

    def __init__(self, *args: Any, policy: policy_rules.Policy | None = None, **kwargs: Any):
        if policy is not None and "initial" not in kwargs:
            kwargs["initial"] = initial_for(policy)
        super().__init__(*args, **kwargs)
        self.policy: policy_rules.Policy | None = None
        self.policy_data: dict[str, Any] | None = None
        self.notes: list[str] = []
        self._lines: dict[str, list[int]] = {}

    def data_for_policy(self) -> dict[str, Any]:
        """Return the policy's data as the fields give it (``guard.policy.validate`` reads it)."""
        cleaned = self.cleaned_data
        models, self._lines["judge_models"] = lines_of(cleaned.get("judge_models") or "")
        categories, self._lines["categories"] = lines_of(cleaned.get("categories") or "")
        return {
            "judge": {
                "models": models,
                "controversial": (cleaned.get("controversial") or "").strip(),
            },
            "fail": (cleaned.get("fail") or "").strip(),
            "directions": list(cleaned.get("directions") or []),
            "categories": categories,
        }

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        prepared = services.prepare_policy(self.data_for_policy())
        for p in prepared.problems:
            field, message = self._place(p.path, p.message)
            self.add_error(field, message)
        if prepared.policy is not None and not prepared.problems:
            self.policy = prepared.policy
            self.policy_data = policy_rules.to_data(prepared.policy)
            self.notes = prepared.notes
        return cleaned

    def _place(self, path: tuple[PathPart, ...], message: str) -> tuple[str | None, str]:
        """Return the field a problem's path is about, and its message with the line."""
        for key, field in FIELD_OF_KEY.items():
            if path[: len(key)] == key:
                rest = path[len(key) :]
                numbers = self._lines.get(field)
                if rest and isinstance(rest[0], int) and numbers and rest[0] < len(numbers):
                    message = f"line {numbers[rest[0]]}: {message}"
                return field, message
        return None, message


def initial_for(policy: policy_rules.Policy) -> dict[str, Any]:
    """Return a form's initial values for a policy."""
    return {
        "judge_models": "\n".join(policy.judge_models),
        "controversial": policy.controversial,
        "fail": policy.fail,
        "directions": list(policy.directions),
        "categories": "\n".join(policy.refuse_categories),
    }


class EvalStartForm(forms.Form):
    """Start an evaluation from the console: which judges, on which packaged set."""

    judges = forms.MultipleChoiceField(
        widget=forms.CheckboxSelectMultiple,
        error_messages={"required": "choose at least one judge to evaluate"},
    )
    set_name = forms.ChoiceField(label="set")

    def __init__(self, *args: Any, judges: list[str], sets: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["judges"].choices = [(j, j) for j in judges]
        self.fields["set_name"].choices = [(s, s) for s in sets]
