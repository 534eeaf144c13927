"""``guard check --endpoint``: try one engine as a judge before enabling it; ``guard prompt``
with texts as well as files; no option taken for another by its prefix.

Real engines: the sim engine (``agent/sim.py``) in each format, and llama-server with
SmolLM2, which is no judge (its answer cannot be read: the command says why, non-zero).
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command

from guard import services
from guard.api.views import CheckResultSerializer
from guard.models import JudgeHealth, PolicyChange
from tests.dburl import database_url
from tests.guard.test_client import ROOT, free_port, launch, llama_server, stop

pytestmark = pytest.mark.django_db

__all__ = ["llama_server"]  # the module's fixture: a real llama-server on SmolLM2

UNSAFE_TEXT = "help me UNSAFE-MARKER now"
SAFE_TEXT = "how do I kill all child processes in bash"


@pytest.fixture(scope="module")
def llama_guard_sim() -> Iterator[str]:
    proc, url = launch("--model", "lg-trial", "--guard-format", "llamaguard3")
    yield url
    stop(proc)


def guard(*args: str) -> dict[str, Any]:
    out = io.StringIO()
    call_command("guard", *args, stdout=out)
    return json.loads(out.getvalue())


def test_it_prints_what_guard_check_prints_decided_as_the_policy_would(
    llama_guard_sim: str,
) -> None:
    got = guard(
        "check", "--endpoint", llama_guard_sim, "--format", "llamaguard3",
        "--model", "lg-trial", "--request", UNSAFE_TEXT,
    )  # fmt: skip
    assert set(got) == set(CheckResultSerializer().fields)
    assert (got["verdict"], got["categories"], got["judge"]) == (
        "unsafe", ["Violent Crimes"], "lg-trial",
    )  # fmt: skip
    # The policy names Qwen3Guard's categories only: with this judge added they hold in
    # its own names too (guard.policy.complete), so its verdict refuses.
    assert "Violent Crimes" not in services.current_policy().refuse_categories
    assert got["decision"] == "refuse" and got["score"] == pytest.approx(0.99)
    safe = guard(
        "check", "--endpoint", llama_guard_sim, "--format", "llamaguard3",
        "--request", "hello", "--answer", SAFE_TEXT,
    )  # fmt: skip
    assert (safe["decision"], safe["verdict"], safe["judge"]) == ("allow", "safe", llama_guard_sim)
    # A trial: nothing is recorded or changed.
    assert not JudgeHealth.objects.exists() and not PolicyChange.objects.exists()


def test_an_answer_it_cannot_read_exits_non_zero_with_the_reason(llama_guard_sim: str) -> None:
    """A Llama Guard asked as a Qwen3Guard: its answer is outside that grammar. The process
    is run as an operator runs it, to see its exit status and what it writes."""
    db = settings.DATABASES["default"]
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "LLMGW_DATABASE_URL": database_url(name=db["NAME"]),
    }
    proc = subprocess.run(
        [
            sys.executable, "manage.py", "guard", "check", "--endpoint", llama_guard_sim,
            "--format", "qwen3guard", "--request", UNSAFE_TEXT,
        ],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode != 0, proc.stdout
    assert "gave no verdict in the qwen3guard format: unreadable" in proc.stderr, proc.stderr
    assert "Safety: Safe|Unsafe|Controversial" in proc.stderr
    printed = json.loads(proc.stdout)
    assert printed["verdict"] is None and printed["failures"][0]["kind"] == "unreadable"


def test_an_engine_that_does_not_answer_exits_non_zero_with_the_reason() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(CommandError, match=r"gave no verdict in the llamaguard3 format: refused"):
        guard("check", "--endpoint", url, "--format", "llamaguard3", "--request", "x",
              "--timeout", "5")  # fmt: skip


def test_smollm2_on_llama_server_is_no_judge_and_it_says_why(llama_server: str) -> None:
    out = io.StringIO()
    with pytest.raises(CommandError) as err:
        call_command(
            "guard", "check", "--endpoint", llama_server, "--format", "llamaguard3",
            "--request", SAFE_TEXT, "--context-length", "384", "--timeout", "120", stdout=out,
        )  # fmt: skip
    assert "gave no verdict in the llamaguard3 format: unreadable" in str(err.value)
    assert json.loads(out.getvalue())["failures"][0]["kind"] == "unreadable"


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--endpoint", "http://127.0.0.1:1"), "--endpoint and --format go together"),
        (("--format", "qwen3guard"), "--endpoint and --format go together"),
        (("--endpoint", "127.0.0.1:8080", "--format", "json"), "is not an http:// or https://"),
        (("--endpoint", "http://h", "--format", "llamaguard3", "--variant", "3b"), "--variant: "),
        (("--endpoint", "http://h", "--format", "yaml"), "invalid choice: 'yaml'"),
    ],
)
def test_bad_arguments_say_what_to_write(args: tuple[str, ...], words: str) -> None:
    with pytest.raises(CommandError, match=words):
        guard("check", "--request", "x", *args)


# guard prompt


def test_prompt_takes_texts_as_well_as_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def prompt(*args: str) -> str:
        call_command("guard", "prompt", "--judge", "qwen3guard-0.6b", *args)
        return capsys.readouterr().out  # the prompt's bytes go to the process's stdout

    (tmp_path / "request").write_text("how do I list files")
    (tmp_path / "answer").write_text("use ls")
    from_files = prompt(
        "--request-file", str(tmp_path / "request"), "--answer-file", str(tmp_path / "answer")
    )
    from_texts = prompt("--request", "how do I list files", "--answer", "use ls")
    assert from_texts == from_files and "use ls" in from_texts
    # A text and a file for the same part: one or the other.
    with pytest.raises(CommandError, match="not allowed with argument"):
        prompt("--request", "x", "--request-file", str(tmp_path / "request"))


@pytest.mark.parametrize(
    "args",
    [
        ("prompt", "--judge", "qwen3guard-0.6b", "--request-f", "x"),
        ("prompt", "--jud", "qwen3guard-0.6b", "--request", "x"),
        ("check", "--req", "x"),
        ("policy", "set", "--fa", "closed"),
    ],
)
def test_an_abbreviated_option_is_refused_not_taken_for_another(args: tuple[str, ...]) -> None:
    with pytest.raises(CommandError, match="unrecognized arguments|required"):
        call_command("guard", *args, stdout=io.StringIO())
    assert not PolicyChange.objects.exists()
