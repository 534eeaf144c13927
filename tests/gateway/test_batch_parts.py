"""The Files and Batch APIs' pure parts: a batch file's line checks, a batch's statuses,
an upload's form, the credential a batch's lines are sent with, whether a held batch's
line goes, waits or fails (hypothesis over the hours and the names of a model)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from catalog import spec
from gateway.batch import lines, multipart, status, token, window
from gateway.path.table import Key


def row(n: int, **over: object) -> dict[str, object]:
    data: dict[str, object] = {"custom_id": f"r{n}", "method": "POST",
                               "url": "/v1/chat/completions",
                               "body": {"model": "chat", "messages": []}}  # fmt: skip
    data.update(over)
    return data


def jsonl(*rows: object) -> bytes:
    return b"".join((r if isinstance(r, bytes) else json.dumps(r).encode()) + b"\n" for r in rows)


def test_good_lines_are_read_with_their_numbers_blank_ones_skipped() -> None:
    found = lines.check(jsonl(row(1), b"", row(2)), max_lines=10)
    assert [(x.number, x.custom_id) for x in found] == [(1, "r1"), (3, "r2")]


def test_every_bad_line_is_named_by_its_number() -> None:
    raw = jsonl(row(1), b"[1]", row(3, method="GET"), row(4, url="/v1/x"), row(5, body=3),
                row(1), row(7, custom_id=7), row(8, body={"messages": []}), b"{oops")  # fmt: skip
    with pytest.raises(lines.LinesError) as refused:
        lines.check(raw, max_lines=100)
    told = dict(refused.value.problems)
    assert sorted(told) == [2, 3, 4, 5, 6, 7, 8, 9]
    assert told[6] == "custom_id 'r1' is used by line 1 too"
    assert "not JSON" in told[9] and "line 9: not JSON" in str(refused.value)
    assert "body.model" in told[8]


def test_too_many_lines_an_empty_file_and_not_utf8_are_refused() -> None:
    with pytest.raises(lines.LinesError, match="line 3: the file has more than 2 lines"):
        lines.check(jsonl(row(1), row(2), row(3)), max_lines=2)
    with pytest.raises(lines.LinesError, match="no lines"):
        lines.check(b"\n\n", max_lines=2)
    with pytest.raises(lines.LinesError, match="line 2: not UTF-8"):
        lines.check(jsonl(row(1)) + b"\xff\n", max_lines=2)


def test_lines_must_all_be_the_batchs_endpoint() -> None:
    found = lines.check(jsonl(row(1), row(2, url="/v1/embeddings")), max_lines=10)
    with pytest.raises(lines.LinesError, match="line 2: url /v1/embeddings is not the batch's"):
        lines.for_endpoint(found, "/v1/chat/completions")
    lines.for_endpoint(found[:1], "/v1/chat/completions")


def test_statuses_move_only_forward_and_stamp_when() -> None:
    b = status.new("batch_1", input_file_id="file-1", endpoint="/v1/embeddings", window="24h",
                   metadata=None, now=100, total=0, owner="o", key="k", key_digest="d")  # fmt: skip
    assert b["expires_at"] == 100 + 24 * 3600
    running = status.move(b, status.IN_PROGRESS, 101)
    assert running["in_progress_at"] == 101 and b["status"] == status.VALIDATING
    cancelling = status.move(running, status.CANCELLING, 102)
    assert status.move(cancelling, status.CANCELLED, 103)["cancelled_at"] == 103
    with pytest.raises(status.StatusRefused):
        status.move(cancelling, status.COMPLETED, 103)
    with pytest.raises(status.StatusRefused):
        status.move(status.move(cancelling, status.CANCELLED, 103), status.IN_PROGRESS, 104)
    assert set(status.shown(b)) & set(status.PRIVATE) == set()


def test_metadata_is_the_apis() -> None:
    assert status.metadata({"a": "b"}) == {"a": "b"}
    for bad in ({"a": 1}, {str(i): "x" for i in range(17)}, ["a"]):
        with pytest.raises(ValueError):
            status.metadata(bad)


def test_a_form_reads_its_file_and_fields() -> None:
    body = (b"--XyZ\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n"
            b"--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.jsonl\"\r\n"
            b"Content-Type: application/octet-stream\r\n\r\n{\"x\": 1}\n\r\n--XyZ--\r\n")  # fmt: skip
    parts = multipart.parse(body, 'multipart/form-data; boundary="XyZ"')
    assert parts["purpose"].data == b"batch"
    assert (parts["file"].filename, parts["file"].data) == ("a.jsonl", b'{"x": 1}\n')
    with pytest.raises(multipart.FormError, match="multipart/form-data"):
        multipart.parse(body, "application/json")
    with pytest.raises(multipart.FormError, match="boundary"):
        multipart.parse(body, "multipart/form-data")


def test_a_batch_credential_is_its_key_in_the_lowest_band_until_its_window_ends() -> None:
    key = Key(id=1, name="k", owner="team:a", models=(), expires=None, priority="high")
    keys = {"abc": key}
    made = token.make("abc", "batch_1", 2000)
    found = token.key_of(made, keys, now=1000)
    assert found is not None and found.name == "k" and found.priority == token.BAND == "batch"
    assert token.key_of(made, keys, now=2001) is None  # the window is over
    assert token.key_of(made[:-1] + ("0" if made[-1] != "0" else "1"), keys, now=1000) is None
    other = token.make("abc", "batch_2", 2000).replace("batch_2", "batch_1")
    assert token.key_of(other, keys, now=1000) is None
    longer = made.replace(".2000.", ".3000.")
    assert token.key_of(longer, keys, now=2500) is None  # its end cannot be moved
    assert token.key_of(made, {}, now=1000) is None  # the key gone (revoked): no credential


def _night(**scaling: object) -> spec.Model:
    every_night = [spec.ScaleWindow(from_="22:00", to="06:00", min=1, max=1)]
    return spec.Model(name="night", aliases=["nightly"], adapters=[spec.Adapter(name="tuned")],
                      scaling=spec.Scaling(**{"min": 0, "max": 1, "schedule": every_night,
                                              **scaling}))  # fmt: skip


@given(st.sampled_from(["night", "nightly", "tuned"]), st.integers(0, 23), st.integers(0, 59))
def test_a_held_line_is_judged_by_its_models_windows_whatever_name_it_uses(
    name: str, hour: int, minute: int
) -> None:
    models = {"night": _night(), "other": spec.Model(name="other")}
    now = datetime(2026, 1, 5, hour, minute, tzinfo=UTC)
    found = window.verdict(models, name, now)
    assert found == window.verdict(models, "night", now)
    if hour >= 22 or hour < 6:
        assert found == (window.GO, "")
    else:
        assert found == (window.WAIT, "waiting for a schedule window of model night "
                                      "(every day 22:00-06:00)")  # fmt: skip


@pytest.mark.parametrize("scaling", [{"min": 0, "max": 1}, {"min": 0, "max": 0}])
def test_a_held_line_whose_model_has_no_window_fails_at_once(scaling: dict[str, int]) -> None:
    """No window will come (the model on demand, or switched off): an error line saying
    why, not a wait to the batch's end."""
    models = {"night": _night(schedule=[], **scaling)}
    for name in ("night", "nightly", "tuned"):
        verdict, why = window.verdict(models, name, datetime(2026, 1, 5, 23, tzinfo=UTC))
        assert verdict == window.FAIL and "model night has no schedule window" in why


def test_a_held_line_naming_no_catalog_model_is_sent_for_the_gateway_to_answer() -> None:
    assert window.verdict({"night": _night()}, "nowhere", datetime(2026, 1, 5, 12, tzinfo=UTC)) \
        == (window.GO, "")  # fmt: skip
