"""A node takes a model's files from the control plane's mirror (agent.mirror), over the
real HTTP of a live server, with its node token; the sha256 checked again at the node."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path
from typing import Any

import pytest

from agent import weights
from agent.mirror import VERIFIED, MirrorClient
from tests.catalog.samples import gpu_model, store
from tests.cluster.helpers import join_node
from tests.updates.hubstandin import Blob, HubStandIn
from updates.models import Fetch

pytestmark = pytest.mark.django_db(transaction=True)

WEIGHTS = bytes(range(256)) * 8192  # 2 MiB


@pytest.fixture
def served(hub: HubStandIn, settings: Any, live_server: Any) -> Any:
    """The live server runs a fetch in a thread of its own (the embedded way)."""
    settings.REDIS_URL = ""
    return live_server


def _place(name: str, node: Any) -> None:
    from catalog.models import ServedModel
    from cluster.models import Assignment, Replica

    r = Replica.objects.create(model=ServedModel.objects.get(name=name), model_name=name)
    Assignment.objects.create(replica=r, node=node)


def _node(name: str, model: str) -> str:
    node, token = join_node(name)
    _place(model, node)
    return token


def test_a_node_waits_for_the_mirror_then_takes_the_folder(
    hub: HubStandIn, served: Any, tmp_path: Path
) -> None:
    hub.commit("org/chat", {"model.safetensors": WEIGHTS, "config.json": b"{}"})
    store(gpu_model("chat"))
    token = _node("n1", "chat")
    seen: list[tuple[int, int | None]] = []
    client = MirrorClient(served.url, token, tmp_path / "weights", poll_s=0.1)
    path = client.fetch("chat", "org/chat", "vllm", progress=lambda d, t: seen.append((d, t)))
    assert path is not None
    folder = Path(path)
    assert (folder / "model.safetensors").read_bytes() == WEIGHTS
    assert (folder / "config.json").read_bytes() == b"{}"
    assert (folder / VERIFIED).is_file() and not list(folder.rglob("*.part"))
    assert seen and seen[-1][0] == len(WEIGHTS) + 2
    # Asked again (a replica restarted): nothing is read twice.
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    assert client.fetch("chat", "org/chat", "vllm") == path
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp
    # The node's inventory says it holds the model's weights (placement prefers it).
    assert weights.held_sources(tmp_path / "weights") == ["org/chat"]
    assert Fetch.objects.count() == 1, [
        (f.revision, f.commit, f.state, f.requested_by, f.surface) for f in Fetch.objects.all()
    ]
    assert hub.count("GET", "/resolve/") == 2


def test_llama_cpp_is_given_the_repository_s_one_gguf(
    hub: HubStandIn, served: Any, tmp_path: Path
) -> None:
    hub.commit("org/small", {"small.Q4.gguf": WEIGHTS, "README.md": b"# s"})
    store(gpu_model("small", source="org/small"))
    token = _node("n1", "small")
    path = MirrorClient(served.url, token, tmp_path, poll_s=0.1).fetch(
        "small", "org/small", "llamacpp"
    )
    assert path is not None and path.endswith("small.Q4.gguf")
    assert Path(path).read_bytes() == WEIGHTS


def test_a_node_resumes_a_file_from_its_part_and_checks_its_sha256_again(
    hub: HubStandIn, served: Any, tmp_path: Path
) -> None:
    hub.plain["w.gguf"] = Blob(WEIGHTS)
    store(gpu_model("chat", source=f"{hub.url}/plain/w.gguf"))
    token = _node("n1", "chat")
    client = MirrorClient(served.url, token, tmp_path / "node", poll_s=0.1)
    client.fetch("chat", f"{hub.url}/plain/w.gguf", "sim")  # not held: no wait, no fetch
    assert Fetch.objects.count() == 0
    from updates import mirror

    mirror.run_fetch(mirror.request_fetch("chat", start=False).pk)
    f = Fetch.objects.get()
    dest = tmp_path / "node" / "mirror" / f.folder
    dest.mkdir(parents=True)
    # A broken transfer left wrong bytes at the start of the .part: resumed from there
    # (Range), the whole file's sha256 differs at the node, and it is refused and deleted.
    (dest / "w.gguf.part").write_bytes(b"x" * 1000)
    with pytest.raises(weights.WeightsError, match="sha256 differs"):
        client.fetch("chat", f"{hub.url}/plain/w.gguf", "llamacpp")
    assert not (dest / "w.gguf.part").exists() and not (dest / "w.gguf").exists()
    # The right first bytes: resumed, and whole.
    (dest / "w.gguf.part").write_bytes(WEIGHTS[:1000])
    path = client.fetch("chat", f"{hub.url}/plain/w.gguf", "llamacpp")
    assert Path(path).read_bytes() == WEIGHTS
    assert hashlib.sha256(Path(path).read_bytes()).hexdigest() == f.commit


def test_a_wrong_node_token_is_refused(hub: HubStandIn, served: Any, tmp_path: Path) -> None:
    hub.commit("org/chat", {"model.safetensors": WEIGHTS})
    store(gpu_model("chat"))
    _node("n1", "chat")
    with pytest.raises(weights.WeightsError, match="refused this node"):
        MirrorClient(served.url, "llmgw_node_wrong", tmp_path).fetch("chat", "org/chat", "vllm")


def test_the_mirror_off_leaves_the_node_fetching_as_before(
    hub: HubStandIn, served: Any, settings: Any, tmp_path: Path
) -> None:
    settings.LLMGW_MIRROR = False
    store(gpu_model("chat"))
    token = _node("n1", "chat")
    client = MirrorClient(served.url, token, tmp_path)
    assert client.fetch("chat", "org/chat", "vllm") is None
    # resolve then hands vLLM the Hugging Face id, as before.
    assert weights.resolve("org/chat", "vllm", tmp_path, mirror=client, model="chat") == "org/chat"


def test_a_cancelled_wait_stops(hub: HubStandIn, served: Any, tmp_path: Path) -> None:
    hub.commit("org/chat", {"model.safetensors": WEIGHTS})
    store(gpu_model("chat"))
    token = _node("n1", "chat")
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(weights.DownloadCancelled):
        MirrorClient(served.url, token, tmp_path).fetch("chat", "org/chat", "vllm", cancel=cancel)


def test_a_node_takes_a_file_whose_name_has_a_space_or_a_hash(
    hub: HubStandIn, served: Any, tmp_path: Path
) -> None:
    names = ["my model.safetensors", "part #2?.safetensors"]
    hub.commit("org/chat", {names[0]: WEIGHTS, names[1]: b"two"})
    store(gpu_model("chat"))
    token = _node("n1", "chat")
    client = MirrorClient(served.url, token, tmp_path / "weights", poll_s=0.1)
    path = client.fetch("chat", "org/chat", "vllm")
    assert path is not None
    assert (Path(path) / names[0]).read_bytes() == WEIGHTS
    assert (Path(path) / names[1]).read_bytes() == b"two"
