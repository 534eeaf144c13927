"""Measure the weights mirror on loopback: fetching a model into it, and a node taking it.

    .venv/bin/python bench/mirror.py [--mb 512] [--runs 3] [--part all|rate|update]
        [--file-mb 32]

``--part update`` (and ``all``, after the rates): the bytes an update fetches. A model of
eight files (six shards of ``--file-mb`` random megabytes, a config and a tokenizer kept in
git) is mirrored and taken by a node at revision N; revision N+1 changes one shard. Printed:
the files and bytes the mirror fetched from the registry for N+1 (counted from the Hub
stand-in's requests, in this process) and the node took from the mirror (its
``MirrorClient.took``), beside what the mirror and a node that hold nothing of N fetch for
N+1 (every file: what the store of one folder per commit fetched for any new commit):

    update of 1 file of 8 (<MB> of <MB>): mirror fetched <n> files, <MB> (one folder per
    commit: 8 files, <MB>); node took <n> files, <MB> (one folder per commit: ...)

A file of ``--mb`` random megabytes is served by the Hub stand-in (tests/updates/
hubstandin.py, a process of its own, sending it with ``sendfile``) as a repository; the
mirror fetches it (``updates.mirror.run_fetch``: the registry asked through
``huggingface_hub``, the file received by ``agent.transfer``, hashed as it arrives, checked
against its sha256 and renamed into place), and a node's agent code (agent.mirror) takes it
from a real web process (``manage.py serve``) with its node token (the sha256 checked again
at the node). Each ends with ``os.sync()``, as the copy does.

Each is compared with a plain copy of the file on the same disk (``shutil.copyfile``: the
kernel copies, no byte passes through Python), and, since a fetch must hash every byte it
receives (at the mirror and again at the node), with a copy followed by the copy's sha256,
and with sha256 alone (over a buffer in memory: the rate one core hashes at). Each is run
``--runs`` times (the mirror's folder, its fetches and the node's folder emptied in
between); the median is printed, then every run and the load average, since on a shared
machine one run says little, and the CPU each took a GB (this process's, all its threads;
for the node's fetch the web process's too), which others' load moves much less than the
rate. What a long-running process does once (importing ``huggingface_hub``, reading the CAs
for TLS) is done before the runs. Runs on a throwaway database on the configured server
(tests/settings.py) and drops it after. Prints figures; asserts nothing. Goal:
each at least 0.8 of the plain copy (docs/updates.md, "Figures").

    mirror fetch: <MB/s> (disk copy <MB/s>)
    node fetch from mirror: <MB/s>
    against: disk copy <MB/s>, copy then its sha256 <MB/s>, sha256 alone <MB/s>; ...
    CPU seconds a GB ...: disk copy <s>, copy then sha256 <s>, mirror fetch <s>, node ...
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

import django  # noqa: E402

django.setup()

from bench import webproc  # noqa: E402

REPO = "bench/weights"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=int, default=512, help="the weights file's size in MB")
    parser.add_argument("--runs", type=int, default=3, help="runs of each measurement")
    parser.add_argument("--part", choices=("all", "rate", "update"), default="all")
    parser.add_argument(
        "--file-mb", type=int, default=32, help="each shard's size in MB (--part update)"
    )
    args = parser.parse_args()
    logging.getLogger("httpx2").setLevel(logging.WARNING)  # huggingface_hub's every request
    if args.part in ("all", "rate"):
        rates(args)
    if args.part in ("all", "update"):
        update(args)


def rates(args: argparse.Namespace) -> None:
    """The rates of a fetch into the mirror and of a node's from it, against a copy."""
    from django.conf import settings

    work = Path(tempfile.mkdtemp(prefix="llmgw-bench-mirror-"))
    size = args.mb * 1_000_000
    source = work / "model.safetensors"
    with open(source, "wb") as f:
        left = size
        while left:
            n = min(left, 8 << 20)
            f.write(os.urandom(n))
            left -= n
    copies, checked, hashes = [], [], []
    cpu: dict[str, list[float]] = {"copy": [], "checked": [], "mirror": [], "node": [], "web": []}
    for _ in range(args.runs):
        os.sync()
        start, used = time.perf_counter(), _cpu()
        shutil.copyfile(source, work / "copy.bin")
        os.sync()
        copies.append(size / 1e6 / (time.perf_counter() - start))
        cpu["copy"].append(_cpu() - used)
        (work / "copy.bin").unlink()
        os.sync()
        start, used = time.perf_counter(), _cpu()
        shutil.copyfile(source, work / "copy.bin")
        _sha256(work / "copy.bin")
        os.sync()
        checked.append(size / 1e6 / (time.perf_counter() - start))
        cpu["checked"].append(_cpu() - used)
        (work / "copy.bin").unlink()
        hashes.append(_sha256_rate(size))

    hub = subprocess.Popen(
        [sys.executable, "-m", "tests.updates.hubstandin", REPO, str(source)],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    url, commit = hub.stdout.readline().split() if hub.stdout else ["", ""]
    old_name, db_name = webproc.throwaway_database("llmgw_bench_mirror")
    web = None
    try:
        settings.HF_ENDPOINT = url
        settings.LLMGW_MIRROR_HOSTS = [url]
        settings.LLMGW_MIRROR_DIR = work / "mirror"
        settings.LLMGW_MIRROR_MAX_GB = 0
        settings.LLMGW_HF_TOKEN_FILE = ""
        from tests.catalog.samples import gpu_model, store
        from updates import mirror
        from updates.models import Fetch

        store(gpu_model("bench", source=REPO))
        # Once a process: importing huggingface_hub (its first call), reading the CAs.
        from agent import transfer
        from updates import registry

        registry.latest(REPO)
        transfer.tls()
        fetches = []
        for i in range(args.runs):
            if i:
                Fetch.objects.all().delete()
                shutil.rmtree(work / "mirror")
            fetch = mirror.request_fetch("bench", start=False)
            os.sync()
            start, used = time.perf_counter(), _cpu()
            done = mirror.run_fetch(fetch.pk)
            os.sync()
            fetches.append(size / 1e6 / (time.perf_counter() - start))
            cpu["mirror"].append(_cpu() - used)
            assert done is not None and done.state == "done", done and done.reason
        print(
            f"mirror fetch: {statistics.median(fetches):.0f} MB/s "
            f"(disk copy {statistics.median(copies):.0f} MB/s)"
        )

        from catalog.models import ServedModel
        from cluster.models import Assignment, Replica
        from tests.cluster.helpers import join_node

        node, token = join_node("bench-node")
        r = Replica.objects.create(model=ServedModel.objects.get(name="bench"), model_name="bench")
        Assignment.objects.create(replica=r, node=node)
        port = webproc.free_port()
        env = dict(
            os.environ,
            DJANGO_SETTINGS_MODULE="llmgw_admin.settings",
            LLMGW_DATABASE_URL=webproc.database_url(db_name),
            LLMGW_DATA_DIR=str(work / "data"),
            LLMGW_SECRET_KEY=str(settings.SECRET_KEY),
            LLMGW_LOCAL_AGENT="false",
            LLMGW_SIMULATE="off",
            LLMGW_MIRROR_DIR=str(work / "mirror"),
            HF_ENDPOINT=url,
            LLMGW_MIRROR_HOSTS=url,
        )
        env.pop("LLMGW_REDIS_URL", None)
        web = webproc.start(env, port, "mirror")
        from agent.mirror import MirrorClient

        nodes = []
        for _ in range(args.runs):
            shutil.rmtree(work / "node", ignore_errors=True)
            client = MirrorClient(f"http://127.0.0.1:{port}", token, work / "node")
            os.sync()
            start, used, served = time.perf_counter(), _cpu(), _cpu(web.pid)
            path = client.fetch("bench", REPO, "vllm")
            os.sync()
            nodes.append(size / 1e6 / (time.perf_counter() - start))
            cpu["node"].append(_cpu() - used)
            cpu["web"].append(_cpu(web.pid) - served)
            assert path is not None
        print(f"node fetch from mirror: {statistics.median(nodes):.0f} MB/s")

        def each(xs: list[float]) -> str:
            return " ".join(f"{x:.0f}" for x in xs)

        copy, both = statistics.median(copies), statistics.median(checked)
        mirrored, node = statistics.median(fetches), statistics.median(nodes)
        print(
            f"against: disk copy {copy:.0f} MB/s, copy then its sha256 {both:.0f} MB/s, "
            f"sha256 alone {statistics.median(hashes):.0f} MB/s; mirror fetch "
            f"{mirrored / copy:.2f} of the copy, {mirrored / both:.2f} of copy then sha256; "
            f"node fetch {node / copy:.2f}, {node / both:.2f}"
        )
        gb = size / 1e9

        def per_gb(key: str) -> str:
            return f"{statistics.median(cpu[key]) / gb:.2f}"

        print(
            f"CPU seconds a GB (medians; steadier than MB/s on a shared machine): disk copy "
            f"{per_gb('copy')}, copy then sha256 {per_gb('checked')}, mirror fetch "
            f"{per_gb('mirror')} (the stand-in sends with sendfile), node fetch {per_gb('node')} "
            f"+ {per_gb('web')} in the web process serving it"
        )
        print(
            f"runs (MB/s): disk copy {each(copies)}; copy then sha256 {each(checked)}; "
            f"sha256 alone {each(hashes)}; mirror fetch {each(fetches)}; "
            f"node fetch {each(nodes)}; load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}"
        )
    finally:
        if web is not None:
            webproc.stop(web)
        hub.terminate()
        hub.wait()
        webproc.drop_database(old_name)
        shutil.rmtree(work, ignore_errors=True)


def update(args: argparse.Namespace) -> None:
    """The files and bytes an update of one shard of eight fetches, on the mirror and on a
    node, against a mirror and a node that hold nothing of the revision before."""
    from django.conf import settings

    from tests.updates.hubstandin import HubStandIn

    work = Path(tempfile.mkdtemp(prefix="llmgw-bench-mirror-update-"))
    shard = args.file_mb * 1_000_000
    files: dict[str, Path] = {}
    for i in range(1, 7):
        files[f"model-{i:05d}-of-00006.safetensors"] = _random_file(work / f"{i}.bin", shard)
    (work / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    (work / "tokenizer.json").write_text('{"version": "1.0"}' * 1000)
    files["config.json"] = work / "config.json"
    files["tokenizer.json"] = work / "tokenizer.json"
    changed = "model-00006-of-00006.safetensors"
    sizes = {name: path.stat().st_size for name, path in files.items()}
    hub = HubStandIn().start()
    repo = "bench/eight"
    v1 = hub.commit(repo, dict(files))
    old_name, db_name = webproc.throwaway_database("llmgw_bench_mirror_update")
    web = None
    try:
        settings.HF_ENDPOINT = hub.url
        settings.LLMGW_MIRROR_HOSTS = [hub.url]
        settings.LLMGW_MIRROR_DIR = work / "mirror"
        settings.LLMGW_MIRROR_MAX_GB = 0
        settings.LLMGW_HF_TOKEN_FILE = ""
        from catalog import spec
        from catalog.models import ServedModel
        from catalog.services import SYSTEM, save_model, stored_specs
        from cluster.models import Assignment, Replica
        from tests.catalog.samples import gpu_model, store
        from tests.cluster.helpers import join_node
        from updates import mirror

        store(gpu_model("eight", source=repo))
        done = mirror.run_fetch(mirror.request_fetch("eight", start=False).pk)
        assert done is not None and done.state == "done", done and done.reason
        node, token = join_node("bench-node")
        r = Replica.objects.create(model=ServedModel.objects.get(name="eight"), model_name="eight")
        Assignment.objects.create(replica=r, node=node)
        port = webproc.free_port()
        env = dict(
            os.environ,
            DJANGO_SETTINGS_MODULE="llmgw_admin.settings",
            LLMGW_DATABASE_URL=webproc.database_url(db_name),
            LLMGW_DATA_DIR=str(work / "data"),
            LLMGW_SECRET_KEY=str(settings.SECRET_KEY),
            LLMGW_LOCAL_AGENT="false",
            LLMGW_SIMULATE="off",
            LLMGW_MIRROR_DIR=str(work / "mirror"),
            HF_ENDPOINT=hub.url,
            LLMGW_MIRROR_HOSTS=hub.url,
        )
        env.pop("LLMGW_REDIS_URL", None)
        web = webproc.start(env, port, "mirror-update")
        from agent.mirror import MirrorClient

        server = f"http://127.0.0.1:{port}"
        holder = MirrorClient(server, token, work / "node")
        assert holder.fetch("eight", repo, "vllm") is not None

        # Revision N+1: one shard changed; the model moved to it (an update's promote).
        new = dict(files)
        new[changed] = _random_file(work / "6b.bin", shard)
        sizes_new = {**sizes, changed: new[changed].stat().st_size}
        v2 = hub.commit(repo, new)
        m = stored_specs(names=["eight"])[0]
        m.origin = spec.Origin(
            repo=repo,
            revision=v2,
            files=m.origin.files,
            previous=spec.PreviousOrigin(source=repo, revision=v1),
        )
        save_model(m, SYSTEM, replacing="eight")
        done = mirror.run_fetch(mirror.request_fetch("eight", v2, start=False).pk)
        assert done is not None and done.state == "done", done and done.reason
        mirror_files = _fetched(hub, v2)
        assert holder.fetch("eight", repo, "vllm") is not None
        node_took = holder.took
        on_disk = mirror.held_bytes()

        # One folder per commit: a mirror and a node holding nothing of N fetch N+1 whole.
        mark = len(hub.requests)
        settings.LLMGW_MIRROR_DIR = work / "mirror-fresh"
        done = mirror.run_fetch(mirror.request_fetch("eight", v2, start=False).pk)
        assert done is not None and done.state == "done", done and done.reason
        fresh_files = _fetched(hub, v2, since=mark)
        fresh = MirrorClient(server, token, work / "node-fresh")
        assert fresh.fetch("eight", repo, "vllm") is not None

        def mb(names: list[str]) -> str:
            return f"{sum(sizes_new[n] for n in names) / 1e6:.1f} MB"

        total = sum(sizes_new.values())
        print(
            f"update of 1 file of 8 ({sizes_new[changed] / 1e6:.1f} MB of {total / 1e6:.1f} "
            f"MB): mirror fetched {len(mirror_files)} file(s), {mb(mirror_files)} (one folder "
            f"per commit: {len(fresh_files)} files, {mb(fresh_files)}); node took "
            f"{node_took.files} file(s), {node_took.bytes / 1e6:.1f} MB (one folder per "
            f"commit: {fresh.took.files} files, {fresh.took.bytes / 1e6:.1f} MB)"
        )
        print(
            f"on disk for both revisions: mirror {on_disk / 1e6:.1f} MB in "
            f"blobs (one folder per commit: {(total + sum(sizes.values())) / 1e6:.1f} MB)"
        )
    finally:
        if web is not None:
            webproc.stop(web)
        hub.stop()
        webproc.drop_database(old_name)
        shutil.rmtree(work, ignore_errors=True)


def _random_file(path: Path, size: int) -> Path:
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(left, 8 << 20)
            f.write(os.urandom(n))
            left -= n
    return path


def _fetched(hub: object, commit: str, since: int = 0) -> list[str]:
    """The files downloaded from the Hub stand-in at ``commit`` (after request ``since``)."""
    marker = f"/resolve/{commit}/"
    return [
        p.split(marker, 1)[1]
        for m, p, _ in hub.requests[since:]  # type: ignore[attr-defined]
        if m == "GET" and marker in p
    ]


def _cpu(pid: int | None = None) -> float:
    """Return the CPU seconds (user and system, every thread) this process, or ``pid``, used."""
    if pid is None:
        t = os.times()
        return t.user + t.system
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    buffer = bytearray(1 << 20)
    with open(path, "rb") as f:
        while n := f.readinto(buffer):
            digest.update(memoryview(buffer)[:n])
    return digest.hexdigest()


def _sha256_rate(size: int) -> float:
    """Return the MB/s one core hashes ``size`` bytes at, from a buffer in memory."""
    buffer = os.urandom(1 << 20)
    digest = hashlib.sha256()
    start = time.perf_counter()
    for _ in range(size >> 20):
        digest.update(buffer)
    return (size >> 20 << 20) / 1e6 / (time.perf_counter() - start)


if __name__ == "__main__":
    main()
