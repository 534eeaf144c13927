"""Measure the weights mirror on loopback: fetching a model into it, and a node taking it.

    .venv/bin/python bench/mirror.py [--mb 512] [--runs 3]

A file of ``--mb`` random megabytes is served by the Hub stand-in (tests/updates/
hubstandin.py, a process of its own) as a repository; the mirror fetches it through
``huggingface_hub`` (its resumable downloader, then the sha256 check and the rename), and
a node's agent code (agent.mirror) takes it from a real web process (``manage.py serve``)
with its node token (the sha256 checked again at the node). Each is compared with a plain
copy of the file on the same disk. Each is run ``--runs`` times (the mirror's folder, its
fetches and the node's folder emptied in between); the median is printed, then every run
and the load average, since on a shared machine one run says little. Runs on a throwaway
database on the configured server (tests/settings.py) and drops it after. Prints figures;
asserts nothing. Goal (issue 19): each at least 0.8 of the plain copy.

    mirror fetch: <MB/s> (disk copy <MB/s>)
    node fetch from mirror: <MB/s>
"""

from __future__ import annotations

import argparse
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
    args = parser.parse_args()
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
    copies = []
    for _ in range(args.runs):
        start = time.perf_counter()
        shutil.copyfile(source, work / "copy.bin")
        os.sync()
        copies.append(size / 1e6 / (time.perf_counter() - start))
        (work / "copy.bin").unlink()

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
        fetches = []
        for i in range(args.runs):
            if i:
                Fetch.objects.all().delete()
                shutil.rmtree(work / "mirror")
            fetch = mirror.request_fetch("bench", start=False)
            start = time.perf_counter()
            done = mirror.run_fetch(fetch.pk)
            os.sync()
            fetches.append(size / 1e6 / (time.perf_counter() - start))
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
            start = time.perf_counter()
            path = client.fetch("bench", REPO, "vllm")
            os.sync()
            nodes.append(size / 1e6 / (time.perf_counter() - start))
            assert path is not None
        print(f"node fetch from mirror: {statistics.median(nodes):.0f} MB/s")

        def each(xs: list[float]) -> str:
            return " ".join(f"{x:.0f}" for x in xs)

        print(
            f"runs (MB/s): disk copy {each(copies)}; mirror fetch {each(fetches)}; "
            f"node fetch {each(nodes)}; load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}"
        )
    finally:
        if web is not None:
            webproc.stop(web)
        hub.terminate()
        hub.wait()
        webproc.drop_database(old_name)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
