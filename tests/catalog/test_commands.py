"""The catalog commands against the database: validate, import (all or nothing), export."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.core.management import call_command
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from catalog.models import ChangeRecord, ServedModel
from tests.catalog.samples import cpu_model, gpu_model, sim_model, store

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command("catalog", *args, stdout=out, stderr=err)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()


def write(tmp_path: Path, models: list[dict[str, Any]] | str, name: str = "c.yaml") -> str:
    path = tmp_path / name
    text = (
        models if isinstance(models, str) else yaml.safe_dump({"models": models}, sort_keys=False)
    )
    path.write_text(text)
    return str(path)


def test_validate_ok_and_one_line_per_problem(tmp_path: Path) -> None:
    good = write(tmp_path, [gpu_model("a"), cpu_model("b")])
    assert run("validate", good)[0] == 0
    bad_profile = gpu_model("c")
    bad_profile["profiles"][0].update({"tp": 4, "nodes": 2, "gpus_per_node": 4})
    bad = write(
        tmp_path,
        [gpu_model("a"), cpu_model("b"), gpu_model("x", scaling={"min": 3, "max": 1}), bad_profile],
    )
    code, _, err = run("validate", bad)
    lines = err.strip().splitlines()
    assert code == 1
    assert len(lines) == 2, lines
    assert lines[0].startswith('models[2].scaling.max (model "x"): ')
    assert lines[1].startswith('models[3].profiles[0].tp (model "c"): ')
    assert "does not match" in lines[1]


@pytest.mark.parametrize(
    ("text", "expect"),
    [
        ("models: [", "not valid YAML"),
        ("- a\n- b\n", "mapping"),
        ("model:\n  - name: a\n", "models"),
        ("models:\n  - name: a\n    sorce: x\n", "source"),
        ("models:\n  - name: a\n    scaling: {min: two}\n", "scaling.min"),
        ("models:\n  - name: a\n    scaling: {idle_timeout: 90}\n", "unit"),
        ("models:\n  - name: a\n    name: b\n", "twice"),
    ],
    ids=[
        "not-yaml",
        "not-mapping",
        "no-models",
        "unknown-key",
        "wrong-type",
        "no-unit",
        "duplicate-key",
    ],
)
def test_bad_files_refused_clearly_and_nothing_written(
    tmp_path: Path, text: str, expect: str
) -> None:
    path = write(tmp_path, text)
    for action in ("validate", "import"):
        code, _, err = run(action, path)
        assert code == 1
        assert expect.lower() in err.lower(), err
    assert not ServedModel.objects.exists()


def test_file_over_10_mb_refused(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_text("models: []\n" + "#" * (10 * 1024 * 1024))
    code, _, err = run("validate", str(path))
    assert code == 1 and "10" in err and "MB" in err


def test_import_is_all_or_nothing(tmp_path: Path) -> None:
    bad = write(tmp_path, [gpu_model("a"), gpu_model("b", fallbacks=["missing"])])
    code, _, err = run("import", bad)
    assert code == 1 and "models[1].fallbacks[0]" in err
    assert not ServedModel.objects.exists()
    assert not ChangeRecord.objects.exists()


def test_import_reports_added_changed_removed_and_dry_run_writes_nothing(tmp_path: Path) -> None:
    store(gpu_model("a"), gpu_model("b"), cpu_model("old"))
    path = write(tmp_path, [gpu_model("a"), gpu_model("b", description="new"), cpu_model("c")])
    code, out, _ = run("import", path, "--replace", "--dry-run")
    assert code == 0
    assert (
        "would be added: c" in out
        and "would be changed: b" in out
        and "would be removed: old" in out
    )
    assert set(ServedModel.objects.values_list("name", flat=True)) == {"a", "b", "old"}
    code, out, _ = run("import", path, "--replace")
    assert "added 1, changed 1, removed 1, unchanged 1" in out
    assert list(ServedModel.objects.values_list("name", flat=True)) == ["a", "b", "c"]
    assert ChangeRecord.objects.filter(surface="file").count() == 3


def test_import_refused_when_it_breaks_a_model_it_keeps(tmp_path: Path) -> None:
    store(cpu_model("small", aliases=["tiny"]), gpu_model("chat", fallbacks=["tiny"]))
    # The file drops the alias that "chat", which the import keeps, falls back to.
    path = write(tmp_path, [cpu_model("small")])
    code, _, err = run("import", path)
    assert code == 1 and '(model "chat")' in err and "tiny" in err, err
    assert ServedModel.objects.get(name="small").aliases.count() == 1


def manage(data: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``manage.py`` as an operator does on an embedded install in ``data``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
    env |= {"LLMGW_DATA_DIR": str(data), "DJANGO_SETTINGS_MODULE": "llmgw_admin.settings"}
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_terminal_import_may_name_the_stored_demo_models(tmp_path: Path) -> None:
    """The audit's case: after ``init``, a file adding one model that falls back to the
    stored demo-chat (and canaries demo-coder) is accepted, dry and for real; with
    --replace, which would remove both, it is refused saying so, and nothing changes."""
    data = tmp_path / "data"
    done = manage(data, "init")
    assert done.returncode == 0, done.stderr[-2000:]
    extra = sim_model("extra", 0, gpu_class="nvidia-l4-24gb", tp=None, fallbacks=["demo-chat"],
                      canary={"model": "demo-coder", "percent": 10})  # fmt: skip
    path = write(tmp_path, [extra])

    def stored() -> list[str]:
        done = manage(data, "catalog", "export")
        assert done.returncode == 0, done.stderr
        return [m["name"] for m in yaml.safe_load(done.stdout)["models"]]

    demo = stored()
    assert "demo-chat" in demo and "demo-coder" in demo
    done = manage(data, "catalog", "import", path, "--dry-run")
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.splitlines() == [
        "would be added: extra",
        "would be added 1, changed 0, removed 0, unchanged 0",
    ]
    assert stored() == demo
    done = manage(data, "catalog", "import", path)
    assert (done.returncode, done.stderr) == (0, "")
    assert "added 1, changed 0, removed 0, unchanged" in done.stdout
    assert stored() == [*demo, "extra"]
    for dry in ("--dry-run", ""):
        done = manage(data, "catalog", "import", path, "--replace", *([dry] if dry else []))
        assert done.returncode == 1 and done.stdout == ""
        assert done.stderr.splitlines() == [
            'models[0].fallbacks[0] (model "extra"): fallback "demo-chat" is removed by '
            '--replace, as the file does not list "demo-chat": add it to the file, or name a '
            "model the file lists",
            'models[0].canary.model (model "extra"): canary "demo-coder" is removed by '
            '--replace, as the file does not list "demo-coder": add it to the file, or name a '
            "model the file lists",
            # ... and the judges the demo's policy judges with are not removed.
            *(f'name (model "{judge}"): judge "{judge}" is named by the guard policy '
              "(judge.models: qwen3guard-0.6b, qwen3guard-0.6b-sim): take it out of the "
              "policy first (the Guard page, the API's policy, or manage.py guard policy set; "
              "or have it judge nothing), then delete it"
              for judge in ("qwen3guard-0.6b", "qwen3guard-0.6b-sim")),
        ]  # fmt: skip
        assert stored() == [*demo, "extra"]


def test_import_may_name_a_stored_models_alias(tmp_path: Path) -> None:
    store(cpu_model("small", aliases=["tiny"]), gpu_model("big", aliases=["large"]))
    path = write(
        tmp_path,
        [gpu_model("chat", fallbacks=["tiny", "big"], canary={"model": "large", "percent": 5})],
    )
    code, out, err = run("import", path, "--dry-run")
    assert (code, err) == (0, "") and "would be added: chat" in out
    assert not ServedModel.objects.filter(name="chat").exists()
    code, out, err = run("import", path)
    assert (code, err) == (0, "") and "added 1, changed 0, removed 0, unchanged 0" in out
    chat = ServedModel.objects.get(name="chat").to_spec()
    assert chat.fallbacks == ["tiny", "big"] and chat.canary and chat.canary.model == "large"
    # --replace keeps them when the file lists them, and checks against those it lists.
    both = write(
        tmp_path,
        [cpu_model("small", aliases=["tiny"]), gpu_model("chat", fallbacks=["tiny"])],
        "both.yaml",
    )
    code, out, err = run("import", both, "--replace")
    assert (code, err) == (0, ""), err
    assert "removed: big" in out
    assert list(ServedModel.objects.values_list("name", flat=True)) == ["small", "chat"]


def test_import_still_refuses_a_fallback_naming_nothing_or_what_replace_removes(
    tmp_path: Path,
) -> None:
    store(cpu_model("small", aliases=["tiny"]), gpu_model("chat"))
    nothing = write(tmp_path, [gpu_model("new", fallbacks=["small", "missing"])], "nothing.yaml")
    for dry in (["--dry-run"], []):
        code, out, err = run("import", nothing, *dry)
        assert code == 1 and out == ""
        assert err.splitlines() == [
            'models[0].fallbacks[1] (model "new"): fallback "missing" is not in the catalog: '
            "name a model or an alias"
        ]
    # The file lists chat but not small: --replace would remove small and its alias.
    replaced = write(tmp_path, [gpu_model("chat", fallbacks=["tiny"])], "replaced.yaml")
    code, _, err = run("import", replaced, "--replace")
    assert code == 1
    assert err.splitlines() == [
        'models[0].fallbacks[0] (model "chat"): fallback "tiny" (an alias of "small") is '
        'removed by --replace, as the file does not list "small": add it to the file, or name '
        "a model the file lists"
    ]
    # A file listing small without its alias takes the alias away: refused as before.
    dropped = write(tmp_path, [cpu_model("small"), gpu_model("chat", fallbacks=["tiny"])], "d.yaml")
    code, _, err = run("import", dropped, "--replace")
    assert code == 1 and 'models[1].fallbacks[0] (model "chat"): fallback "tiny" is not in' in err
    assert ServedModel.objects.count() == 2
    assert ServedModel.objects.get(name="chat").to_spec().fallbacks == []
    assert not ChangeRecord.objects.filter(surface="file").exists()


def test_import_clashing_with_a_kept_model_is_refused_at_the_files_model(tmp_path: Path) -> None:
    store(cpu_model("small", aliases=["tiny"]), gpu_model("chat", canary={"model": "small"}))
    path = write(
        tmp_path,
        [
            gpu_model("other", aliases=["tiny"]),
            gpu_model("next", canary={"model": "tiny", "percent": 5}),
        ],
    )
    code, _, err = run("import", path, "--dry-run")
    assert code == 1
    assert err.splitlines() == [
        'models[0].aliases[0] (model "other"): alias "tiny" is already an alias of "small": '
        "an alias is listed once and names one model",
        'models[1].canary.model (model "next"): "tiny" is already the canary of "chat": '
        "name another catalog model",
    ]
    assert ServedModel.objects.count() == 2


def test_export_import_export_is_byte_identical(tmp_path: Path) -> None:
    store(
        cpu_model("small", scaling={"min": 0, "max": 2, "idle_timeout": "45m"}),
        gpu_model(
            "chat",
            aliases=["chat-latest", "c"],
            fallbacks=["small"],
            scaling={
                "min": 1,
                "max": 4,
                "prewarm": "15m",
                "schedule": [{"days": ["weekdays"], "from": "22:00", "to": "06:00", "min": 2}],
            },
            adapters=[{"name": "chat-sql", "source": "/lora/sql", "scale": 0.5}],
            slo={"ttft_p99": "800ms", "tpot_p99": "50ms"},
            origin={
                "repo": "org/chat",
                "revision": "abc123",
                "files": [{"path": "model.safetensors", "sha256": "00" * 32, "bytes": 123}],
                "previous": {"source": "org/chat-old", "revision": "def"},
            },
        ),
        gpu_model(
            "judge",
            role="guard",
            guard={"format": "qwen3guard", "categories": ["Violent", "Jailbreak"]},
        ),
    )
    first = tmp_path / "first.yaml"
    run("export", str(first))
    ServedModel.objects.all().delete()
    assert run("import", str(first))[0] == 0
    second = tmp_path / "second.yaml"
    run("export", str(second))
    assert first.read_bytes() == second.read_bytes()


names = st.from_regex(r"[a-z][a-z0-9-]{0,12}", fullmatch=True)


@st.composite
def catalogs(draw: Any) -> list[dict[str, Any]]:
    """Draw a small valid catalog in file form."""
    picked = draw(st.lists(names, min_size=1, max_size=4, unique=True))
    models = []
    for i, name in enumerate(picked):
        if draw(st.booleans()):
            m = cpu_model(
                name,
                description=draw(
                    st.text(st.characters(codec="utf-8", blacklist_characters="\x00"), max_size=20)
                ),
            )
        else:
            m = gpu_model(name, scaling={"min": draw(st.integers(0, 3)), "max": 4})
            m["profiles"][0]["args"] = draw(
                st.lists(
                    st.sampled_from(["--enforce-eager", "--max-model-len=4096"]),
                    max_size=2,
                    unique=True,  # a flag given twice is refused (the engine keeps one)
                )
            )
        if i and draw(st.booleans()):
            m["fallbacks"] = [picked[0]]
        models.append(m)
    return models


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(models=catalogs())
def test_property_export_import_export_identical(
    tmp_path: Path, models: list[dict[str, Any]]
) -> None:
    ServedModel.objects.all().delete()
    assert run("import", write(tmp_path, models))[0] == 0
    first = tmp_path / "1.yaml"
    second = tmp_path / "2.yaml"
    run("export", str(first))
    ServedModel.objects.all().delete()
    assert run("import", str(first))[0] == 0
    run("export", str(second))
    assert first.read_bytes() == second.read_bytes()


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    models=catalogs(),
    junk=st.sampled_from(
        [
            ("scaling", {"min": 5, "max": 1}),
            ("owner", "nobody"),
            ("fallbacks", ["nowhere"]),
            ("class", "gold"),
            ("bogus", 1),
        ]
    ),
)
def test_property_invalid_file_or_api_body_writes_nothing(
    tmp_path: Path, models: list[dict[str, Any]], junk: tuple[str, Any], api_for: Any, operator: Any
) -> None:
    ServedModel.objects.all().delete()
    ChangeRecord.objects.all().delete()
    store(cpu_model("kept"))
    before = (list(ServedModel.objects.values()), ChangeRecord.objects.count())
    bad = [dict(m) for m in models]
    bad[-1][junk[0]] = junk[1]
    assert run("import", write(tmp_path, bad))[0] == 1
    assert (
        api_for(operator).post("/api/v1/catalog/models/", bad[-1], format="json").status_code == 400
    )
    assert (
        api_for(operator)
        .put("/api/v1/catalog/models/kept/", dict(bad[-1], name="kept"), format="json")
        .status_code
        == 400
    )
    assert (list(ServedModel.objects.values()), ChangeRecord.objects.count()) == before


ORIGIN = {
    "repo": "org/chat",
    "revision": "abc123",
    "files": [{"path": "model.safetensors", "sha256": "00" * 32, "bytes": 123}],
    "previous": {"source": "org/chat", "revision": "def456"},
}


def test_a_file_without_the_origin_keeps_the_recorded_one(tmp_path: Path) -> None:
    # The mirror writes a model's origin; an operator's catalog file leaves it out, and
    # importing it must not forget it (the update check, the rollback and what the mirror
    # keeps read it). Found in a walk: a file imported after an update wiped it.
    store(gpu_model("chat", source="org/chat", origin=ORIGIN))
    before = ChangeRecord.objects.count()
    path = write(tmp_path, [gpu_model("chat", source="org/chat")])
    code, out, _ = run("import", path)
    assert code == 0 and "unchanged 1" in out
    assert ChangeRecord.objects.count() == before
    edited = write(tmp_path, [gpu_model("chat", source="org/chat", description="chat")])
    assert run("import", edited)[0] == 0
    kept = ServedModel.objects.get(name="chat").to_spec()
    assert kept.description == "chat" and kept.origin is not None
    assert kept.origin.revision == "abc123" and kept.origin.previous.revision == "def456"
    # Another source: that origin describes other weights, and goes.
    moved = write(tmp_path, [gpu_model("chat", source="org/chat-2")])
    assert run("import", moved)[0] == 0
    assert ServedModel.objects.get(name="chat").to_spec().origin is None
