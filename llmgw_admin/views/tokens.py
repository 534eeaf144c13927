"""The console's page for API and join tokens: list, issue (the secret shown once), revoke.

The API's rules (``llmgw_admin.api.views``, ``cluster.api.views``): admins only, for
reading as for writing, since a token acts as a user or lets a machine join. Each
issue and revoke is logged with who did it (``cluster.ClusterAction``, "through
console"); secrets are never stored or logged, only their hashes.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth import get_user_model
from django.http import HttpRequest, HttpResponse, HttpResponsePermanentRedirect
from django.shortcuts import get_object_or_404, redirect, render
from django.templatetags.static import static
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from cluster.models import JoinToken
from cluster.services import log_action
from llmgw_core.models import ApiToken, issue_problem, revoke
from llmgw_core.roles import ADMIN, role_required

VIA = "console"
KINDS = ("api", "join")


def _expires(value: datetime | None) -> datetime | None:
    if value is not None and value <= timezone.now():
        raise forms.ValidationError("expires is in the past: give a later time, or none")
    return value


class _Expiring(forms.Form):
    expires = forms.DateTimeField(
        required=False,
        help_text="Empty: never.",
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}),
    )

    def clean_expires(self) -> datetime | None:
        return _expires(self.cleaned_data.get("expires"))


class ApiTokenForm(_Expiring):
    """A new API token: whose it is, and its name."""

    user = forms.ModelChoiceField(
        queryset=get_user_model().objects.filter(is_active=True).order_by("username"),
        to_field_name="username",
        help_text="The token acts as this user, with the user's role.",
    )
    name = forms.CharField(max_length=100, help_text="What uses it, e.g. ci-deploy.")
    field_order = ("user", "name", "expires")

    def __init__(self, *args: Any, maker: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.maker = maker

    def clean_user(self) -> Any:
        user = self.cleaned_data["user"]
        if self.maker is not None and (why := issue_problem(self.maker, user)):
            raise forms.ValidationError(why)
        return user

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        user, name = data.get("user"), data.get("name")
        if user and name and ApiToken.objects.filter(user=user, name=name, revoked=None).exists():
            self.add_error(
                "name", "this user already has a live token of that name: revoke it or pick another"
            )
        return data


class JoinTokenForm(_Expiring):
    """A new join token: its name and how often it may be used."""

    name = forms.CharField(max_length=100, help_text="Where it is for, e.g. rack-7.")
    max_uses = forms.IntegerField(
        required=False, min_value=1, max_value=1_000_000, help_text="Empty: any number."
    )
    field_order = ("name", "max_uses", "expires")


def _page(
    request: HttpRequest,
    *,
    api_form: ApiTokenForm | None = None,
    join_form: JoinTokenForm | None = None,
    issued: dict[str, str] | None = None,
    status: int = 200,
) -> HttpResponse:
    context = {
        "api_tokens": ApiToken.objects.select_related("user").order_by("-created")[:200],
        "join_tokens": JoinToken.objects.select_related("created_by").order_by("-created")[:200],
        "api_form": api_form or ApiTokenForm(prefix="api", initial={"user": request.user}),
        "join_form": join_form or JoinTokenForm(prefix="join"),
        "issued": issued,
        "now": timezone.now(),
    }
    return render(request, "tokens.html", context, status=status)


@role_required(ADMIN)
@require_GET
def tokens(request: HttpRequest) -> HttpResponse:
    """List every API and join token (never a secret)."""
    return _page(request)


@role_required(ADMIN)
@require_http_methods(["POST"])
def token_issue(request: HttpRequest, kind: str) -> HttpResponse:
    """Issue a token; the answer is the page with its secret, the one time it is shown."""
    if kind == "api":
        api_form = ApiTokenForm(request.POST, prefix="api", maker=request.user)
        if not api_form.is_valid():
            return _page(request, api_form=api_form, status=400)
        data = api_form.cleaned_data
        token, secret = ApiToken.issue(data["user"], data["name"], data["expires"], by=request.user)
        log_action(request.user, "api token issued", f"api token {token.pk} ({token})", "", VIA)
        issued = {"kind": "API token", "name": str(token), "secret": secret}
    elif kind == "join":
        join_form = JoinTokenForm(request.POST, prefix="join")
        if not join_form.is_valid():
            return _page(request, join_form=join_form, status=400)
        data = join_form.cleaned_data
        join, secret = JoinToken.issue(
            data["name"],
            expires=data["expires"],
            max_uses=data["max_uses"],
            created_by=request.user,
        )
        log_action(
            request.user, "join token issued", f"join token {join.pk} ({join.name})", "", VIA
        )
        issued = {"kind": "join token", "name": join.name, "secret": secret}
    else:
        return HttpResponse(f"no token kind {kind!r}: api or join", status=404)
    response = _page(request, issued=issued)
    response["Cache-Control"] = "no-store"  # the secret is in it
    return response


@role_required(ADMIN)
@require_POST
def token_revoke(request: HttpRequest, kind: str, pk: int) -> HttpResponse:
    """Revoke a token: it stops working at once; the row stays, marked revoked."""
    model: Any = {"api": ApiToken, "join": JoinToken}.get(kind)
    if model is None:
        return HttpResponse(f"no token kind {kind!r}: api or join", status=404)
    token = get_object_or_404(model, pk=pk)
    label = f"{'API' if kind == 'api' else 'join'} token {token}"
    if revoke(token):
        log_action(
            request.user, f"{kind} token revoked", f"{kind} token {token.pk} ({token})", "", VIA
        )
        messages.success(request, f"Revoked {label}.")
    else:
        messages.info(request, f"{label} was already revoked.")
    return redirect("tokens")


@require_GET
def favicon(request: HttpRequest) -> HttpResponse:
    """Browsers ask every site for /favicon.ico: the console's, from static/."""
    return HttpResponsePermanentRedirect(static("llmgw/favicon.ico"))
