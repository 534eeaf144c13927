"""Weights: local paths, Hugging Face ids, and downloads from a real local HTTP server."""

from __future__ import annotations

import hashlib
import http.server
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from agent import weights
from agent.sha import BUFFER
from agent.weights import DownloadCancelled, WeightsError

CONTENT = bytes(range(256)) * 4096  # 1 MiB, every byte value


@dataclass
class Origin:
    """Serve files with Range requests, breaking a transfer halfway when told."""

    files: dict[str, bytes] = field(default_factory=dict)
    # Paths whose next full transfer stops after this many bytes.
    truncate: dict[str, int] = field(default_factory=dict)
    linked_sha: dict[str, str] = field(default_factory=dict)
    ignore_range: bool = False
    requests: list[tuple[str, str | None]] = field(default_factory=list)
    url: str = ""


@pytest.fixture
def origin() -> Iterator[Origin]:
    state = Origin()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            rng = self.headers.get("Range")
            state.requests.append((self.path, rng))
            data = state.files.get(self.path)
            if data is None:
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            start = 0
            if rng and not state.ignore_range:
                start = int(re.fullmatch(r"bytes=(\d+)-", rng).group(1))  # type: ignore[union-attr]
                if start >= len(data):
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{len(data)}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            else:
                self.send_response(200)
            body = data[start:]
            self.send_header("Content-Length", str(len(body)))
            if self.path in state.linked_sha:
                self.send_header("X-Linked-Etag", f'"{state.linked_sha[self.path]}"')
            self.end_headers()
            cut = state.truncate.pop(self.path, None)
            if cut is not None:
                # Promise the whole body, send part of it, hang up.
                self.wfile.write(body[:cut])
                self.wfile.flush()
                self.close_connection = True
                return
            self.wfile.write(body)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    yield state
    server.shutdown()
    server.server_close()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_local_path_used_as_is(tmp_path: Path) -> None:
    model = tmp_path / "small.gguf"
    model.write_bytes(b"gguf")
    assert weights.resolve(str(model), "llamacpp", tmp_path / "w", folders=[tmp_path]) == str(model)
    # The weights folder is one where local sources may be.
    assert weights.resolve(str(model), "llamacpp", tmp_path) == str(model)


def test_missing_local_path_refused(tmp_path: Path) -> None:
    with pytest.raises(WeightsError, match="not found on this node") as info:
        weights.resolve(str(tmp_path / "nope.gguf"), "llamacpp", tmp_path)
    assert info.value.retry is False


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_hugging_face_id_handed_to_engines_that_fetch(engine: str, tmp_path: Path) -> None:
    assert weights.resolve("org/chat-model", engine, tmp_path) == "org/chat-model"


def test_hugging_face_id_refused_for_llamacpp(tmp_path: Path) -> None:
    with pytest.raises(WeightsError, match="Hugging Face id.*local path or an http"):
        weights.resolve("org/chat-model", "llamacpp", tmp_path)


def test_sim_reads_no_weights(tmp_path: Path) -> None:
    assert (
        weights.resolve("https://nowhere.invalid/x.gguf", "sim", tmp_path)
        == "https://nowhere.invalid/x.gguf"
    )


def test_kinds() -> None:
    assert weights.kind("https://h/x.gguf") == "url"
    assert weights.kind("org/name") == "hf"
    assert weights.kind("/abs/path") == "path"
    assert weights.kind("./rel") == "path"


def test_download_checked_and_recorded(origin: Origin, tmp_path: Path) -> None:
    origin.files["/m/small.gguf"] = CONTENT
    url = origin.url + "/m/small.gguf"
    seen: list[tuple[int, int | None]] = []
    path = weights.resolve(
        url,
        "llamacpp",
        tmp_path,
        sha256=sha(CONTENT),
        progress=lambda d, t: seen.append((d, t)),
        hosts=[origin.url],
    )
    assert Path(path).read_bytes() == CONTENT
    assert Path(path).name.endswith("-small.gguf")
    assert seen[-1] == (len(CONTENT), len(CONTENT))
    assert not list(tmp_path.glob("*.part"))
    assert weights.held_sources(tmp_path) == [url]
    # Held: not fetched again.
    before = len(origin.requests)
    assert (
        weights.resolve(url, "llamacpp", tmp_path, sha256=sha(CONTENT), hosts=[origin.url]) == path
    )
    assert len(origin.requests) == before


def test_download_resumes_a_broken_transfer(origin: Origin, tmp_path: Path) -> None:
    origin.files["/m/big.gguf"] = CONTENT
    origin.truncate["/m/big.gguf"] = 300_000
    path = weights.download(origin.url + "/m/big.gguf", tmp_path, sha256=sha(CONTENT))
    assert Path(path).read_bytes() == CONTENT
    assert origin.requests == [("/m/big.gguf", None), ("/m/big.gguf", "bytes=300000-")]


def test_download_resumes_a_part_left_by_an_earlier_agent(origin: Origin, tmp_path: Path) -> None:
    url = origin.url + "/m/big.gguf"
    origin.files["/m/big.gguf"] = CONTENT
    (tmp_path / f"{weights.file_name(url)}.part").write_bytes(CONTENT[:123_456])
    path = weights.download(url, tmp_path, sha256=sha(CONTENT))
    assert Path(path).read_bytes() == CONTENT
    assert origin.requests == [("/m/big.gguf", "bytes=123456-")]


def test_a_complete_part_is_finished_without_a_body(origin: Origin, tmp_path: Path) -> None:
    url = origin.url + "/m/big.gguf"
    origin.files["/m/big.gguf"] = CONTENT
    (tmp_path / f"{weights.file_name(url)}.part").write_bytes(CONTENT)
    assert Path(weights.download(url, tmp_path)).read_bytes() == CONTENT


def test_origin_ignoring_range_starts_over(origin: Origin, tmp_path: Path) -> None:
    url = origin.url + "/m/big.gguf"
    origin.files["/m/big.gguf"] = CONTENT
    origin.ignore_range = True
    (tmp_path / f"{weights.file_name(url)}.part").write_bytes(b"stale bytes")
    assert Path(weights.download(url, tmp_path, sha256=sha(CONTENT))).read_bytes() == CONTENT


def test_sha256_mismatch_refused_and_nothing_kept(origin: Origin, tmp_path: Path) -> None:
    origin.files["/m/x.gguf"] = CONTENT
    with pytest.raises(WeightsError, match="not the expected") as info:
        weights.download(origin.url + "/m/x.gguf", tmp_path, sha256="0" * 64)
    assert info.value.retry is False
    assert list(tmp_path.iterdir()) == []


def test_origin_sha256_checked(origin: Origin, tmp_path: Path) -> None:
    origin.files["/m/x.gguf"] = CONTENT
    origin.linked_sha["/m/x.gguf"] = "f" * 64
    with pytest.raises(WeightsError, match="f{64}"):
        weights.download(origin.url + "/m/x.gguf", tmp_path)
    origin.linked_sha["/m/x.gguf"] = sha(CONTENT)
    assert Path(weights.download(origin.url + "/m/x.gguf", tmp_path)).read_bytes() == CONTENT


def test_missing_file_is_final(origin: Origin, tmp_path: Path) -> None:
    with pytest.raises(WeightsError, match="HTTP 404") as info:
        weights.download(origin.url + "/nope.gguf", tmp_path)
    assert info.value.retry is False


def test_unreachable_origin_may_be_retried(tmp_path: Path) -> None:
    with pytest.raises(WeightsError, match="failed") as info:
        weights.download("http://127.0.0.1:9/x.gguf", tmp_path)
    assert info.value.retry is True


def test_cancelled_download_keeps_what_it_has(origin: Origin, tmp_path: Path) -> None:
    url = origin.url + "/m/x.gguf"
    origin.files["/m/x.gguf"] = CONTENT * (3 * BUFFER // len(CONTENT))  # 3 buffers
    cancel = threading.Event()

    def progress(done: int, total: int | None) -> None:
        cancel.set()

    with pytest.raises(DownloadCancelled):
        weights.download(url, tmp_path, progress=progress, cancel=cancel)
    part = tmp_path / f"{weights.file_name(url)}.part"
    assert 0 < part.stat().st_size < len(CONTENT) * (3 * BUFFER // len(CONTENT))
    assert weights.held_sources(tmp_path) == []


def test_new_sha256_fetches_again(origin: Origin, tmp_path: Path) -> None:
    url = origin.url + "/m/x.gguf"
    origin.files["/m/x.gguf"] = CONTENT
    weights.download(url, tmp_path, sha256=sha(CONTENT))
    changed = CONTENT[::-1]
    origin.files["/m/x.gguf"] = changed
    assert Path(weights.download(url, tmp_path, sha256=sha(changed))).read_bytes() == changed


def test_origins_are_scheme_host_and_port_as_written() -> None:
    assert weights.origin_of("https://HuggingFace.co/org/x.gguf") == "https://huggingface.co"
    assert weights.origin_of("https://huggingface.co:443/x") == "https://huggingface.co"
    assert weights.origin_of("http://10.0.0.5:8080/x") == "http://10.0.0.5:8080"
    assert weights.origin_of("http://[fd00::1]/x") == "http://[fd00::1]"
    assert weights.allowed_origins(None) == {"https://huggingface.co"}
    assert weights.allowed_origins(["http://mirror:8080/", " "]) == {"http://mirror:8080"}


def test_a_link_out_of_the_weights_folder_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "w"
    folder.mkdir()
    (tmp_path / "outside.gguf").write_bytes(b"gguf")
    (folder / "in.gguf").symlink_to(tmp_path / "outside.gguf")
    with pytest.raises(WeightsError, match="outside this node's weights folders") as info:
        weights.resolve(str(folder / "in.gguf"), "llamacpp", folder)
    assert str(folder / "in.gguf") in info.value.detail
    assert info.value.summary == "the weights source is outside this node's weights folders"


def test_a_url_source_of_another_origin_is_refused_for_every_engine(tmp_path: Path) -> None:
    for engine in ("llamacpp", "vllm", "sglang", "trtllm"):
        with pytest.raises(WeightsError, match="URL this node does not fetch from"):
            weights.resolve("http://169.254.169.254/latest/x", engine, tmp_path)
