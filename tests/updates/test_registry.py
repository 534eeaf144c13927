"""The registry through huggingface_hub, against the Hub stand-in."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from tests.updates.hubstandin import HubStandIn
from updates import registry


def test_a_repository_s_commit_and_files_with_their_sha256(hub: HubStandIn) -> None:
    sha = hub.commit("org/m", {"model.safetensors": b"w" * 1000, "README.md": b"hello"})
    state = registry.latest("org/m")
    assert state.commit == sha
    by_path = {f.path: f for f in state.files}
    assert by_path["model.safetensors"].sha256 == hashlib.sha256(b"w" * 1000).hexdigest()
    assert by_path["model.safetensors"].size == 1000
    assert by_path["README.md"].sha256 == ""  # kept in git: its blob id instead
    assert by_path["README.md"].blob_id
    assert [f.path for f in state.weights] == ["model.safetensors"]
    assert hub.count("GET", "/api/models/org/m") == 1


def test_a_pinned_revision_is_asked_for_by_its_commit(hub: HubStandIn) -> None:
    first = hub.commit("org/m", {"model.safetensors": b"a"})
    hub.commit("org/m", {"model.safetensors": b"b"})
    assert registry.latest("org/m", first).commit == first
    with pytest.raises(registry.RegistryError, match="has no revision"):
        registry.latest("org/m", "f" * 40)


def test_a_repository_gone_is_an_error_with_the_reason(hub: HubStandIn) -> None:
    with pytest.raises(registry.RegistryError, match="is not there"):
        registry.latest("org/gone")


def test_a_registry_that_does_not_answer_is_an_error(settings: Any) -> None:
    settings.HF_ENDPOINT = "http://127.0.0.1:9"
    with pytest.raises(registry.RegistryError, match="did not answer"):
        registry.latest("org/m")


def test_a_plain_url_is_its_own_registry_by_its_etag(hub: HubStandIn) -> None:
    from tests.updates.hubstandin import Blob

    hub.plain["w.gguf"] = Blob(b"gguf-bytes")
    state = registry.latest(f"{hub.url}/plain/w.gguf")
    assert state.commit == hashlib.sha256(b"gguf-bytes").hexdigest()
    assert state.files[0].sha256 == state.commit
    hub.plain["w.gguf"] = Blob(b"other")
    assert registry.latest(f"{hub.url}/plain/w.gguf").commit != state.commit


def test_a_url_on_a_host_not_allowed_is_refused_before_any_request(
    hub: HubStandIn, settings: Any
) -> None:
    settings.LLMGW_MIRROR_HOSTS = ["https://huggingface.co"]
    with pytest.raises(registry.RegistryError, match="LLMGW_MIRROR_HOSTS"):
        registry.latest(f"{hub.url}/plain/w.gguf")
    assert hub.requests == []


def test_the_token_is_read_from_its_file_again_when_it_changes(
    hub: HubStandIn, settings: Any, tmp_path: Any
) -> None:
    token = tmp_path / "hf-token"
    token.write_text("hf_first\n")
    settings.LLMGW_HF_TOKEN_FILE = str(token)
    hub.commit("org/m", {"model.safetensors": b"a"})
    registry.latest("org/m")
    token.write_text("hf_second_longer\n")
    registry.latest("org/m")
    assert hub.tokens_seen == ["Bearer hf_first", "Bearer hf_second_longer"]


def test_a_token_file_that_cannot_be_read_names_the_variable_not_a_token(settings: Any) -> None:
    settings.LLMGW_HF_TOKEN_FILE = "/nonexistent/hf-token"
    with pytest.raises(registry.RegistryError, match="LLMGW_HF_TOKEN_FILE names /nonexistent"):
        registry.latest("org/m")


def test_a_source_with_no_registry_says_so() -> None:
    with pytest.raises(registry.RegistryError, match="has no registry"):
        registry.latest("/models/local.gguf")


def test_a_path_or_commit_unfit_for_a_name_is_refused(hub: HubStandIn) -> None:
    assert registry.unfit_path("model-00001 of 2.safetensors") == ""
    for bad in ("a\nb", "a\rb", "a\x00b", "a\x85b", "a\u2028b", "<b>.bin", "x>y", "", "a" * 1025):
        assert registry.unfit_path(bad), bad
    hub.commit("org/m", {"ok.safetensors": b"w", "a\r\nb.bin": b"x"})
    with pytest.raises(registry.RegistryError, match="is not a file's name"):
        registry.latest("org/m")
