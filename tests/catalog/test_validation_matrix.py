"""The rule matrix: one bad input, refused the same way (field and message) everywhere.

Each case is a model as a file writes it, with one thing wrong. The rules' own answer
(``rules.check_catalog``) is the reference; the model's ``full_clean``, the console's form,
the admin's add page, the API and a catalog file must each report that problem at the same
field with the same message, and write nothing.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from django.core.exceptions import ValidationError

from catalog import codec, convert, files, forms, rules, services
from catalog.models import ServedModel
from catalog.problems import Problem
from tests.catalog.samples import cpu_model, gpu_model, store

pytestmark = pytest.mark.django_db


def _with(base: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    data = copy.deepcopy(base)
    target = data
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    return data


def _external(key_file: str, url: str = "https://api.example.com/v1") -> dict[str, Any]:
    return {"name": "bad", "source": "cloud",
            "external": {"url": url, "model": "gpt-x", "api_key_file": key_file}}  # fmt: skip


CASES: list[tuple[str, dict[str, Any], tuple[Any, ...]]] = [
    ("no source", _with(gpu_model("bad"), ("source",), ""), ("source",)),
    (
        "max below min",
        _with(gpu_model("bad"), ("scaling",), {"min": 3, "max": 2}),
        ("scaling", "max"),
    ),
    ("bad class", _with(gpu_model("bad"), ("class",), "vip"), ("class",)),
    ("bad owner", _with(gpu_model("bad"), ("owner",), "alice"), ("owner",)),
    (
        "tp arithmetic",
        _with(
            gpu_model("bad"),
            ("profiles", 0),
            {
                "name": "h100",
                "gpu_class": "nvidia-h100-80gb",
                "tp": 4,
                "nodes": 2,
                "gpus_per_node": 4,
            },
        ),
        ("profiles", 0, "tp"),
    ),
    (
        "unknown engine",
        _with(gpu_model("bad"), ("profiles", 0, "engine"), "tgi"),
        ("profiles", 0, "engine"),
    ),
    (
        "gpu class missing for vllm",
        _with(gpu_model("bad"), ("profiles", 0, "gpu_class"), ""),
        ("profiles", 0, "gpu_class"),
    ),
    (
        "unsafe argument",
        _with(gpu_model("bad"), ("profiles", 0, "args"), ["--port", "9000"]),
        ("profiles", 0, "args"),
    ),
    (
        "prefix of a flag the agent sets",
        _with(gpu_model("bad"), ("profiles", 0, "args"), ["--tensor-parallel", "2"]),
        ("profiles", 0, "args"),
    ),
    (
        "argument naming a folder",
        _with(gpu_model("bad"), ("profiles", 0, "args"), ["--download-dir", "/etc"]),
        ("profiles", 0, "args"),
    ),
    (
        "environment that loads code",
        _with(gpu_model("bad"), ("profiles", 0, "env"), {"BASH_ENV": "/tmp/x"}),
        ("profiles", 0, "env", "BASH_ENV"),
    ),
    (
        "bad window clock",
        _with(
            gpu_model("bad"), ("scaling", "schedule"), [{"from": "8am", "to": "18:00", "min": 1}]
        ),
        ("scaling", "schedule", 0, "from"),
    ),
    (
        "adapter with the model's name",
        _with(gpu_model("bad"), ("adapters",), [{"name": "bad", "source": "/lora/x"}]),
        ("adapters", 0, "name"),
    ),
    (
        "alias taken by another model",
        _with(gpu_model("bad"), ("aliases",), ["taken"]),
        ("aliases", 0),
    ),
    (
        "fallback not in the catalog",
        _with(gpu_model("bad"), ("fallbacks",), ["nowhere"]),
        ("fallbacks", 0),
    ),
    (
        "canary percent out of range",
        _with(gpu_model("bad"), ("canary",), {"model": "taken", "percent": 120}),
        ("canary", "percent"),
    ),
    (
        "guard without format",
        _with(gpu_model("bad"), ("role",), "guard"),
        ("guard", "format"),
    ),
    # Issue 16: the gateway read any file and sent it, as a bearer key, to any address.
    ("key file outside the secrets folder", _external("/etc/shadow"), ("external", "api_key_file")),
    ("key file climbing out with ..", _external("../../etc/shadow"), ("external", "api_key_file")),
    (
        "plain http provider",
        _external("openai", url="http://provider.example.com/v1"),
        ("external", "url"),
    ),
    # Issue 17: a line break or an escape in a name broke pages, a chat and /metrics.
    ("CR in the name", _with(gpu_model("bad"), ("name",), "ba\rd"), ("name",)),
    ("LF in an alias", _with(gpu_model("bad"), ("aliases",), ["b\nad-2"]), ("aliases", 0)),
    (
        "zero-width space in an alias",
        _with(gpu_model("bad"), ("aliases",), ["b\u200bad"]),
        ("aliases", 0),
    ),
    (
        "ESC in an external model",
        _with(_external("openai"), ("external", "model"), "gpt\x1b[2J"),
        ("external", "model"),
    ),
    # Names a URL or a browser reads as something else (the name grammar).
    ("a ../ name", gpu_model("../etc"), ("name",)),
    ("a name with a space", gpu_model("a b"), ("name",)),
    ("a name ending in an action", gpu_model("org/edit"), ("name",)),
    ("an alias with //", gpu_model("bad", aliases=["org//x"]), ("aliases", 0)),
    ("an owner with a line break", _with(gpu_model("bad"), ("owner",), "org:a\nb"), ("owner",)),
    # ... and a judge, which answers no client, as a fallback.
    (
        "judge as a fallback",
        _with(gpu_model("bad"), ("fallbacks",), ["referee-alias"]),
        ("fallbacks", 0),
    ),
]


JUDGE = gpu_model("referee", role="guard", guard={"format": "qwen3guard"},
                  aliases=["referee-alias"])  # fmt: skip


@pytest.fixture
def neighbour(settings: Any) -> None:
    """Other models in the catalog (one a judge), so cross-model rules have something to
    clash with; and a secrets folder, for the key files' rule."""
    settings.LLMGW_SECRETS_DIR = "/run/secrets/llmgw"
    store(cpu_model("taken"), JUDGE)


def reference(data: dict[str, Any]) -> Problem:
    """Return the rules' problem for the case's path (asserting there is one)."""
    model, problems = codec.decode_model(data)
    assert not problems, problems
    problems = services.check_change(model, None)
    return problems[0]


def expect(data: dict[str, Any], path: tuple[Any, ...]) -> Problem:
    model, shape = codec.decode_model(data)
    assert not shape
    problems = services.check_change(model, None)
    matching = [p for p in problems if p.path == path]
    assert matching, f"the rules did not refuse {path}: {[(p.path, p.message) for p in problems]}"
    return matching[0]


def _field_errors(form: Any, loc: convert.Location, formsets: dict[str, Any]) -> list[str]:
    if loc.group is None:
        return [str(e) for e in form.errors.get(loc.field or "__all__", [])]
    fs = formsets[loc.group]
    rows = fs.live_forms()
    return [str(e) for e in rows[loc.index or 0].errors.get(loc.field or "__all__", [])]


def post_data(data: dict[str, Any], prefix_main: str = "") -> dict[str, Any]:
    """Return the console's (and the admin's) POST data for a model as a file writes it."""
    model, problems = codec.decode_model(data)
    assert not problems
    values = convert.instance_values(model)
    form = forms.ServedModelForm()
    out: dict[str, Any] = {}
    for name, field in form.fields.items():
        value = field.prepare_value(values.get(name))
        if isinstance(value, bool):
            if value:
                out[name] = "on"
            continue
        out[name] = "" if value is None else value
    for group, rows in convert.child_values(model).items():
        fs_form = forms.FORMSETS[group].form
        out[f"{group}-TOTAL_FORMS"] = str(len(rows))
        out[f"{group}-INITIAL_FORMS"] = "0"
        for i, row in enumerate(rows):
            f = fs_form()
            for name, field in f.fields.items():
                if name in ("id", "model", "DELETE"):
                    continue
                value = field.prepare_value(row.get(name))
                if isinstance(value, bool):
                    if value:
                        out[f"{group}-{i}-{name}"] = "on"
                    continue
                out[f"{group}-{i}-{name}"] = "" if value is None else value
    return out


@pytest.mark.parametrize(("label", "data", "path"), CASES, ids=[c[0] for c in CASES])
def test_same_refusal_on_every_surface(
    label: str,
    data: dict[str, Any],
    path: tuple[Any, ...],
    neighbour: None,
    client_for: Any,
    operator: Any,
    api_for: Any,
) -> None:
    want = expect(data, path)
    loc = convert.locate(path)

    # 1. A catalog file.
    neighbours = [codec.decode_model(cpu_model("taken"))[0], codec.decode_model(JUDGE)[0]]
    models, shape = files.load_catalog_text(
        files.dump_catalog([*neighbours, codec.decode_model(data)[0]])
    )
    assert not shape
    got = [p for p in rules.check_catalog(models, services.environment()) if p.path == path]
    assert got and got[0].message == want.message and got[0].code == want.code
    assert got[0].file_path.startswith("models[2].")

    # 2. The API.
    r = api_for(operator).post("/api/v1/catalog/models/", data, format="json")
    assert r.status_code == 400
    assert {"field": want.field, "message": want.message, "code": want.code} in [
        {k: e[k] for k in ("field", "message", "code")} for e in r.json()["errors"]
    ]

    # 3. The console's form (the same form class the admin uses).
    post = post_data(data)
    form = forms.ServedModelForm(post)
    formsets = forms.build_formsets(post, form.instance)
    assert forms.check_bundle(form, formsets, None) is None
    assert want.message in _field_errors(form, loc, formsets)

    # 4. The admin's add page.
    admin_post = dict(post, _save="Save")
    r = client_for(operator).post("/admin/catalog/servedmodel/add/", admin_post)
    assert r.status_code == 200, "the admin saved a refused model"
    admin_form = r.context["adminform"].form
    admin_formsets = {fs.formset.prefix: fs.formset for fs in r.context["inline_admin_formsets"]}
    assert want.message in _field_errors(admin_form, loc, admin_formsets)

    assert not ServedModel.objects.filter(name="bad").exists()

    # 5. The model's own full_clean, on rows written without the rules (as raw SQL or
    # an old database might hold them).
    model, _ = codec.decode_model(data)
    instance = services._write(ServedModel(), rules.normalize(model))
    instance.checked_as_bundle = False
    if loc.group is None:
        target = instance
        key = loc.field
    else:
        rows = list(getattr(instance, loc.group).all())
        target = rows[loc.index or 0]
        key = loc.field
    with pytest.raises(ValidationError) as exc:
        target.full_clean()
    assert want.message in exc.value.message_dict.get(key, []), exc.value.message_dict
