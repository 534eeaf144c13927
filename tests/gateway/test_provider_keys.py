"""An external provider's key file, read by the real gateway as it sends.

Before, the gateway read whatever ``external.api_key_file`` named (``/etc/shadow`` as
root) and sent it to the provider as ``Authorization: Bearer …``, its other lines as
extra headers. The catalog now refuses such a path on every surface
(tests/catalog/test_validation_matrix.py); a row that predates the rule, a symbolic link
out of the folder or a file of several lines is refused again here, and the provider (a
real local HTTP server) receives nothing."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from catalog import spec
from gateway.path.table import Key, digest
from tests.gateway.harness import KEY, Harness, model

SHADOW = "root:$6$salt$hash:19000:0:99999:7:::\ndaemon:*:19000:0:99999:7:::\nbin:*:19000::::::\n"


@pytest.fixture
def h() -> Iterator[Harness]:
    harness = Harness()
    # The key names the external model, so nothing but its key file stands in the way.
    harness.keys = {digest(KEY): Key(1, "harness", "team:t", ("cloud",), None)}
    yield harness
    harness.close()


@pytest.fixture(autouse=True)
def listed_providers(settings: Any) -> list[str]:
    """The host:port pairs a plain http:// provider may be at: each stand-in's, as made."""
    settings.LLMGW_EXTERNAL_HTTP_HOSTS = []
    return settings.LLMGW_EXTERNAL_HTTP_HOSTS


def listed(provider: Any) -> str:
    """List a stand-in provider's host:port for plain http:// (this test's settings)."""
    from django.conf import settings

    settings.LLMGW_EXTERNAL_HTTP_HOSTS.append(provider.url.split("//", 1)[1].split("/")[0])
    return provider.url


@pytest.fixture
def secrets(tmp_path: Path, settings: Any) -> Path:
    folder = tmp_path / "secrets"
    folder.mkdir()
    settings.LLMGW_SECRETS_DIR = str(folder)
    return folder


def serve_cloud(h: Harness, key_file: str) -> Any:
    provider = h.engine("provider")
    cloud = model("cloud", external=spec.External(url=listed(provider) + "/v1", model="gpt-x",
                                                  api_key_file=key_file))  # fmt: skip
    h.serve([cloud], [])
    return provider


def refused(h: Harness) -> str:
    client = openai.OpenAI(base_url=h.url + "/v1", api_key=KEY, max_retries=0, timeout=10)
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(model="cloud", messages=[{"role": "user", "content": "x"}])
    assert caught.value.status_code == 502
    return caught.value.message


def test_etc_shadow_is_never_read_or_sent(h: Harness, secrets: Path) -> None:
    provider = serve_cloud(h, "/etc/shadow")
    message = refused(h)
    assert provider.requests == 0
    assert "was not asked" in message and "shadow" not in message and "root" not in message


def test_a_file_outside_the_folder_a_link_out_of_it_and_no_folder_are_refused(
    h: Harness, secrets: Path, tmp_path: Path, settings: Any
) -> None:
    outside = tmp_path / "shadow"
    outside.write_text(SHADOW)
    (secrets / "link").symlink_to(outside)
    provider = serve_cloud(h, str(outside))
    refused(h)
    for key_file in ("link", str(secrets / "link"), "../shadow"):
        h.models = [model("cloud", external=spec.External(url=listed(provider) + "/v1",
                                                          model="gpt-x", api_key_file=key_file))]  # fmt: skip
        h.refresh()
        refused(h)
    settings.LLMGW_SECRETS_DIR = ""
    (secrets / "openai").write_text("sk-fine\n")
    h.models = [model("cloud", external=spec.External(url=listed(provider) + "/v1", model="gpt-x",
                                                      api_key_file=str(secrets / "openai")))]  # fmt: skip
    h.refresh()
    refused(h)
    assert provider.requests == 0


def test_a_link_in_the_folder_to_a_key_outside_it_is_refused_and_one_inside_it_is_sent(
    h: Harness, secrets: Path, tmp_path: Path
) -> None:
    """The link's real path is what counts: a link to a well-formed one-line key outside the
    folder passes every other check, so only the folder check refuses it."""
    outside = tmp_path / "elsewhere"
    outside.write_text("sk-outside-the-folder\n")
    (secrets / "link").symlink_to(outside)
    provider = serve_cloud(h, "link")
    refused(h)
    assert provider.requests == 0 and provider.auth == []
    # A link to a key inside the folder is followed.
    (secrets / "real").write_text("sk-inside\n")
    (secrets / "inner").symlink_to(secrets / "real")
    h.models = [model("cloud", external=spec.External(url=provider.url + "/v1", model="gpt-x",
                                                      api_key_file="inner"))]  # fmt: skip
    h.refresh()
    client = openai.OpenAI(base_url=h.url + "/v1", api_key=KEY, max_retries=0, timeout=10)
    client.chat.completions.create(model="cloud", messages=[{"role": "user", "content": "x"}])
    assert provider.auth == ["Bearer sk-inside"]


@pytest.mark.parametrize(
    "content",
    [SHADOW, "sk-one\nX-Injected: yes\n", "sk-one\r\nsk-two", "sk one", "sk-\x00one", "",
     "sk-" + "x" * 5000],
    ids=["shadow", "injected header", "two keys", "space", "nul", "empty", "5 kB"],
)  # fmt: skip
def test_a_key_file_that_is_not_one_line_is_refused(
    h: Harness, secrets: Path, content: str
) -> None:
    (secrets / "openai").write_text(content)
    provider = serve_cloud(h, "openai")
    refused(h)
    assert provider.requests == 0


def test_a_key_in_the_folder_is_sent_and_read_again_when_it_changes(
    h: Harness, secrets: Path
) -> None:
    key_file = secrets / "openai"
    key_file.write_text("sk-provider-secret\n")
    provider = serve_cloud(h, "openai")
    client = openai.OpenAI(base_url=h.url + "/v1", api_key=KEY, max_retries=0, timeout=10)
    answer = client.chat.completions.create(model="cloud",
                                            messages=[{"role": "user", "content": "x"}])  # fmt: skip
    assert (answer.choices[0].message.content or "").startswith("provider0")
    assert provider.auth == ["Bearer sk-provider-secret"]
    # Rotated into two lines: refused, and the provider is not asked.
    key_file.write_text("sk-rotated\nX-Injected: yes\n")
    os.utime(key_file, (1, 1))
    refused(h)
    assert provider.requests == 1


def test_a_fifo_named_as_the_key_file_is_refused_without_blocking(
    h: Harness, secrets: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A FIFO blocks whoever opens it to read until something writes to it: read on the
    gateway's event loop, it held every request of the process. It is refused at once,
    saying what it is, and the provider is not asked."""
    fifo = secrets / "openai"
    os.mkfifo(fifo)
    provider = serve_cloud(h, "openai")
    try:
        with caplog.at_level("WARNING", logger="gateway"):
            message = refused(h)
        assert "was not asked" in message
        assert provider.requests == 0
        assert f"api_key_file {fifo} is a FIFO, not a regular file: it is not read" in caplog.text
        # The process goes on answering (its event loop was never held).
        client = openai.OpenAI(base_url=h.url + "/v1", api_key=KEY, max_retries=0, timeout=5)
        assert [m.id for m in client.models.list()] == ["cloud"]
    finally:
        # Were a reader still held on it, a writer's open lets it go (the test ends).
        with contextlib.suppress(OSError):  # no reader: nothing was held
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


def test_a_key_file_replaced_by_a_fifo_after_its_check_is_refused_by_the_read(
    secrets: Path,
) -> None:
    from gateway.path.providers import _read

    fifo = secrets / "late"
    os.mkfifo(fifo)
    read: list[tuple[str, str]] = []
    reader = threading.Thread(target=lambda: read.append(_read(str(fifo))), daemon=True)
    reader.start()
    reader.join(5)
    held = reader.is_alive()
    if held:  # a reader held on it: a writer's open lets it go
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(5)
    assert not held, "reading the key file blocked on a FIFO"
    assert read == [("", "is a FIFO, not a regular file: it is not read (it could block); "
                         "write the key in a plain file in the secrets folder")]  # fmt: skip
