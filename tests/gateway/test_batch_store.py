"""Batches on disk as the runner and an operator meet them: the journal a killed runner
leaves, and ``manage.py gateway batch list|show|cancel``."""

from __future__ import annotations

import json
import time
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from gateway.batch import status, store


@pytest.fixture
def files_dir(settings: Any, tmp_path: Path) -> Path:
    settings.LLMGW_FILES_DIR = tmp_path / "files"
    return tmp_path / "files"


def made(now: int = 1000) -> dict[str, Any]:
    batch = status.new(store.new_batch_id(), input_file_id="file-abc", window="24h",
                       endpoint="/v1/chat/completions", metadata=None, now=now, total=3,
                       owner="team:a", key="k", key_digest="d")  # fmt: skip
    store.save_batch(batch)
    return batch


def test_a_line_torn_by_a_killed_runner_is_cut_off_and_runs_again(files_dir: Path) -> None:
    batch = made()
    journal = store.Journal(batch["id"])
    journal.write({"line": 1, "ok": True, "out": {}})
    journal.write({"line": 2, "ok": False, "out": {}})
    journal.close()
    path = store.batch_path(batch["id"], ".journal")
    with path.open("ab") as handle:
        handle.write(b'{"line": 3, "ok": tr')  # killed while writing line 3
    assert sorted(store.journal(batch["id"])) == [1, 2]
    assert path.read_bytes().endswith(b"\n")  # the torn tail is gone: line 3 is written whole next
    again = store.Journal(batch["id"])
    again.write({"line": 3, "ok": True, "out": {}})
    again.close()
    assert sorted(store.journal(batch["id"])) == [1, 2, 3]


def test_files_are_their_owners_alone(files_dir: Path) -> None:
    meta = store.save_file("team:a", "in.jsonl", "batch", b"x\n")
    assert store.get_file("team:b", meta["id"]) is None
    assert store.file_content("team:a", meta["id"]) == b"x\n"
    assert not store.delete_file("team:b", meta["id"])
    assert [m["id"] for m in store.list_files("team:a")] == [meta["id"]]
    assert store.get_file("team:a", "../../etc/passwd") is None
    assert store.delete_file("team:a", meta["id"])
    assert store.list_files("team:a") == []


def test_an_operator_lists_shows_and_cancels_a_batch(files_dir: Path) -> None:
    batch = made()
    out = StringIO()
    call_command("gateway", "batch", "list", stdout=out)
    assert batch["id"] in out.getvalue() and "team:a" in out.getvalue()
    out = StringIO()
    call_command("gateway", "batch", "show", batch["id"], stdout=out)
    assert json.loads(out.getvalue())["status"] == "validating"
    out = StringIO()
    call_command("gateway", "batch", "cancel", batch["id"], stdout=out)
    assert "cancelling" in out.getvalue()
    assert store.get_batch(None, batch["id"])["status"] == "cancelling"
    with pytest.raises(CommandError, match="no batch batch_nope"):
        call_command("gateway", "batch", "cancel", "batch_nope")
    ended = made()
    store.update(ended["id"], lambda b: dict(b, status="completed"))
    with pytest.raises(CommandError, match="is completed: it cannot be cancelled"):
        call_command("gateway", "batch", "cancel", ended["id"])


def test_the_batches_page_shows_progress_and_an_operator_cancels(
    files_dir: Path, client_for: Any, operator: Any, viewer: Any
) -> None:
    batch = made(now=1000)
    store.update(batch["id"], lambda b: dict(
        status.move(b, status.IN_PROGRESS, 1000),
        request_counts={"total": 4, "completed": 1, "failed": 1}))  # fmt: skip
    page = client_for(viewer).get("/gateway/batches/")
    assert page.status_code == 200
    text = page.content.decode()
    assert batch["id"] in text and "2 / 4 (50 %)" in text
    assert 'http-equiv="refresh"' not in text  # the table is asked for, not the page
    assert 'hx-trigger="every 2s"' in text
    assert 'data-role="cancel"' not in text  # a viewer has no Cancel button
    assert 'data-role="cancel"' in client_for(operator).get("/gateway/batches/").content.decode()
    # A viewer may not cancel; an operator may.
    url = f"/gateway/batches/{batch['id']}/cancel/"
    assert client_for(viewer).post(url).status_code == 403
    assert store.get_batch(None, batch["id"])["status"] == "in_progress"
    done = client_for(operator).post(url, follow=True)
    assert "is cancelling: what finished is kept" in done.content.decode()
    assert store.get_batch(None, batch["id"])["status"] == "cancelling"
    assert "No batch batch_x." in client_for(operator).post(
        "/gateway/batches/batch_x/cancel/", follow=True).content.decode()  # fmt: skip


def test_old_files_and_ended_batches_are_pruned_running_ones_kept(files_dir: Path) -> None:
    old = store.save_file("team:a", "old.jsonl", "batch", b"x\n")
    path = store.root() / "files" / f"{old['id']}.json"
    path.write_text(json.dumps(dict(old, created_at=1000)))
    new = store.save_file("team:a", "new.jsonl", "batch", b"y\n")
    ended, running = made(now=1000), made(now=1000)
    store.update(ended["id"], lambda b: dict(b, status="completed"))
    assert store.prune(days=1, now=1000 + 2 * 86400) == 1
    assert store.get_file(None, old["id"]) is None and store.get_file(None, new["id"])
    assert store.get_batch(None, ended["id"]) is None
    assert store.get_batch(None, running["id"]) is not None


def test_a_batch_past_its_window_ends_expired_with_what_finished_kept(
    files_dir: Path, settings: Any
) -> None:
    from gateway.batch import runner

    settings.LLMGW_GATEWAY_URL = "http://127.0.0.1:9"  # nothing is sent: the window is over
    rows = [{"custom_id": f"r{n}", "method": "POST", "url": "/v1/chat/completions",
             "body": {"model": "m"}} for n in (1, 2, 3)]  # fmt: skip
    data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    file = store.save_file("team:a", "in.jsonl", "batch", data)
    batch = status.new(store.new_batch_id(), input_file_id=file["id"], window="24h",
                       endpoint="/v1/chat/completions", metadata=None, now=1000, total=0,
                       owner="team:a", key="k", key_digest="d")  # fmt: skip
    store.save_batch(status.move(batch, status.IN_PROGRESS, 1000))  # its window ended long ago
    journal = store.Journal(batch["id"])
    journal.write({"line": 1, "ok": True, "out": status.output_line("q1", "r1", 200, {}, None)})
    journal.close()
    assert runner.run_next() == 1
    ended = store.get_batch(None, batch["id"])
    assert ended["status"] == "expired" and ended["expired_at"]
    assert ended["request_counts"] == {"total": 3, "completed": 1, "failed": 0}
    out = store.file_content("team:a", ended["output_file_id"]).decode().splitlines()
    assert [json.loads(t)["custom_id"] for t in out] == ["r1"]
    assert runner.run_next() == 0  # ended: nothing more to run


def test_a_held_back_line_waits_as_told_and_goes_again_not_an_error(
    files_dir: Path, settings: Any
) -> None:
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from gateway.batch import runner, token

    seen: list[tuple[str, str]] = []

    class Gateway(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append((body["input"], self.headers["Authorization"]))
            held = body["input"] == "a" and len([s for s in seen if s[0] == "a"]) == 1
            answer = json.dumps({"error": {"message": "held"}} if held else {"data": []}).encode()
            self.send_response(429 if held else 200)
            if held:
                self.send_header("Retry-After", "0.1")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Gateway)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        settings.LLMGW_GATEWAY_URL = f"http://127.0.0.1:{server.server_address[1]}"
        rows = [{"custom_id": c, "method": "POST", "url": "/v1/embeddings",
                 "body": {"model": "m", "input": c}} for c in ("a", "b")]  # fmt: skip
        file = store.save_file("team:a", "in.jsonl", "batch",
                               "".join(json.dumps(r) + "\n" for r in rows).encode())  # fmt: skip
        batch = status.new(store.new_batch_id(), input_file_id=file["id"], window="24h",
                           endpoint="/v1/embeddings", metadata=None, now=int(time.time()),
                           total=0, owner="team:a", key="k", key_digest="d")  # fmt: skip
        store.save_batch(batch)
        assert runner.run_next() == 1
    finally:
        server.shutdown()
        server.server_close()
    ended = store.get_batch(None, batch["id"])
    assert ended["status"] == "completed" and ended["error_file_id"] is None
    assert ended["request_counts"] == {"total": 2, "completed": 2, "failed": 0}
    assert sorted(s[0] for s in seen) == ["a", "a", "b"]  # "a" held once, then answered
    assert {s[1] for s in seen} == {f"Bearer {token.make('d', batch['id'], batch['expires_at'])}"}
