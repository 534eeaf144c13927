"""An external provider's key file and address, as the rules see them:
plain data, with the installation's facts passed in (``catalog.rules.Environment``).

Before, ``external.api_key_file`` could be any path (``/etc/shadow``) and ``url`` any
``http://`` address: the gateway read the file and sent it there."""

from __future__ import annotations

import posixpath

import pytest
from hypothesis import given
from hypothesis import strategies as st

from catalog.rules import STRICT, Environment, check_catalog, check_model, key_file, url_problem
from catalog.spec import External, GuardModel, Model, Profile, Scaling

SECRETS = Environment(secrets_dir="/run/secrets/llmgw")


def cloud(url: str = "https://api.openai.com/v1", key: str = "") -> Model:
    return Model(name="cloud", source="cloud",
                 external=External(url=url, model="gpt-4o", api_key_file=key))  # fmt: skip


def problems(m: Model, env: Environment = STRICT) -> list[tuple[tuple, str]]:
    return [(p.path, p.code) for p in check_model(m, env)]


def test_no_key_file_without_a_secrets_folder_and_the_error_says_so() -> None:
    (p,) = check_model(cloud(key="openai"))
    assert (p.path, p.code) == (("external", "api_key_file"), "no_secrets_dir")
    assert "LLMGW_SECRETS_DIR" in p.message and "no key file is allowed" in p.message
    assert problems(cloud()) == []  # a provider with no key file needs no folder


@pytest.mark.parametrize(
    "path",
    ["/etc/shadow", "../../etc/shadow", "openai/../../../etc/shadow", "/run/secrets/llmgw",
     "/run/secrets/llmgw/../other", "/run/secrets/llmgw-other/key", "..", "a/../b",
     "openai\n", "ope\x00nai"],
)  # fmt: skip
def test_a_key_file_outside_the_secrets_folder_is_refused(path: str) -> None:
    found = check_model(cloud(key=path), SECRETS)
    assert [(p.path, p.code) for p in found] == [(("external", "api_key_file"), "key_file_outside")]
    assert "secrets folder" in found[0].message


@pytest.mark.parametrize(
    ("path", "full"),
    [("openai", "/run/secrets/llmgw/openai"), ("team/openai", "/run/secrets/llmgw/team/openai"),
     ("/run/secrets/llmgw/openai", "/run/secrets/llmgw/openai"),
     ("./openai", "/run/secrets/llmgw/openai")],
)  # fmt: skip
def test_a_key_file_in_the_secrets_folder_is_allowed(path: str, full: str) -> None:
    assert problems(cloud(key=path), SECRETS) == []
    assert key_file(path, "/run/secrets/llmgw/") == (full, "")


@given(st.text(alphabet="/.ab\n\x00", max_size=24))
def test_an_allowed_key_file_is_always_inside_the_folder(path: str) -> None:
    full, why = key_file(path, "/s/d")
    if not why:
        assert full.startswith("/s/d/") and posixpath.normpath(full) == full
        assert ".." not in path.split("/") and "\n" not in path and "\x00" not in path
    else:
        assert full == ""


@pytest.mark.parametrize(
    ("url", "listed"),
    [
        ("http://api.example.com/v1", "api.example.com"),
        ("http://10.0.0.1:8000/", "10.0.0.1:8000"),
        ("http://[2001:db8::1]/v1", "[2001:db8::1]:80"),
        ("HTTP://Provider.lan", "provider.lan:80"),
        ("http://127.0.0.1:9000/v1", "127.0.0.1:9000"),
        ("http://localhost/v1", "LOCALHOST"),
        ("http://[::1]:8000", "[::1]:8000"),
    ],
)
def test_plain_http_is_refused_unless_its_host_and_port_are_listed(url: str, listed: str) -> None:
    (p,) = check_model(cloud(url=url))
    assert (p.path, p.code) == (("external", "url"), "plain_http")
    assert "https://" in p.message and "LLMGW_EXTERNAL_HTTP_HOSTS" in p.message
    assert problems(cloud(url=url), Environment(http_hosts=frozenset({listed}))) == []


@pytest.mark.parametrize(
    ("url", "listed"),
    [
        # Loopback is not a pass: Redis, the database, another engine listen there.
        ("http://127.0.0.1:6379", "127.0.0.1:9000"),
        ("http://127.0.0.1:6379", "127.0.0.1"),
        ("http://redis.localhost:6379", "127.0.0.1:6379"),
        ("http://anything.localhost", "localhost"),
        ("http://10.0.0.1:8001/", "10.0.0.1:8000"),
    ],
)
def test_a_listed_host_opens_only_its_own_port(url: str, listed: str) -> None:
    assert problems(cloud(url=url), Environment(http_hosts=frozenset({listed}))) == [
        (("external", "url"), "plain_http")
    ]


@pytest.mark.parametrize("url", ["https://api.example.com", "https://127.0.0.1:9000/v1"])
def test_https_is_allowed(url: str) -> None:
    assert problems(cloud(url=url)) == [] and url_problem(url) == ""


def judge() -> Model:
    return Model(name="judge", source="org/judge", role="guard", aliases=["j"],
                 guard=GuardModel(format="qwen3guard"), scaling=Scaling(min=1),
                 profiles=[Profile(name="gpu", gpu_class="nvidia-h100-80gb")])  # fmt: skip


@pytest.mark.parametrize("name", ["judge", "j"])
def test_a_judge_or_its_alias_is_refused_as_a_fallback(name: str) -> None:
    chat = Model(name="chat", source="org/chat", fallbacks=[name], scaling=Scaling(min=1),
                 profiles=[Profile(name="gpu", gpu_class="nvidia-h100-80gb")])  # fmt: skip
    (p,) = check_catalog([chat, judge()])
    assert (p.model, p.path, p.code) == ("chat", ("fallbacks", 0), "fallback_guard")
    assert "guard model" in p.message


@pytest.mark.parametrize("value", ["/", "//", "secrets", "./run/secrets"])
def test_a_secrets_folder_that_is_not_one_is_refused_at_start(value: str) -> None:
    import os
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", "import llmgw_admin.settings"], capture_output=True, text=True,
        env={**os.environ, "LLMGW_SECRETS_DIR": value}, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1 and "LLMGW_SECRETS_DIR" in done.stderr
    assert "like /run/secrets/llmgw" in done.stderr
