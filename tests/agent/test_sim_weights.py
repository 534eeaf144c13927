"""The sim engine's weights file (agent.simweights): how well it answers, read at start.

The pure part over plain data, then a real sim process given a file, as the agent starts
it (``--weights``, the path the replica's source resolved to).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent import simweights
from agent.engines import command_for
from agent.flags import arg_problems
from agent.simweights import Weights
from tests.agent.test_sim import ROOT, Sim, launch

FAST = ("--ttft", "0.01", "--tps", "1000")


def weights_file(tmp: Path, **figures: object) -> Path:
    path = tmp / "sim-weights.json"
    path.write_text(json.dumps({"llmgw-sim-weights": 1, **figures}))
    return path


# -- the file ------------------------------------------------------------------------------


def test_a_weights_file_reads_its_figures_and_defaults_the_rest() -> None:
    raw = b'{"llmgw-sim-weights": 1, "name": "v2", "arithmetic": 0.5}'
    assert simweights.parse(raw) == Weights(arithmetic=0.5, name="v2")
    assert simweights.parse(b'{"llmgw-sim-weights": 1}') == Weights()


@pytest.mark.parametrize(
    "raw",
    [b"GGUF\x03\x00\x00\x00", b"", b"[1, 2]", b'{"arithmetic": 0.5}', b"{not json", b"\xff{"],
)
def test_a_file_that_is_no_sim_weights_is_none(raw: bytes) -> None:
    assert simweights.parse(raw) is None


@pytest.mark.parametrize(
    ("data", "said"),
    [
        ({"llmgw-sim-weights": 2}, '"llmgw-sim-weights" is 2; write 1'),
        (
            {"llmgw-sim-weights": 1, "arithmetic": 1.5},
            "arithmetic is 1.5; write a number from 0 to 1",
        ),
        ({"llmgw-sim-weights": 1, "error_rate": -0.1}, "error_rate is -0.1"),
        ({"llmgw-sim-weights": 1, "json_format": True}, "json_format is True"),
        ({"llmgw-sim-weights": 1, "json_format": "1"}, "json_format is '1'"),
        ({"llmgw-sim-weights": 1, "accuracy": 1}, "unknown key 'accuracy'"),
        ({"llmgw-sim-weights": 1, "name": 3}, "name is 3"),
    ],
)
def test_a_sim_weights_file_with_a_wrong_value_is_refused_saying_what(data, said) -> None:
    with pytest.raises(simweights.WeightsFileError, match="w.json: ") as caught:
        simweights.parse(json.dumps(data).encode(), "w.json")
    assert said in str(caught.value)


def test_nan_is_refused() -> None:
    with pytest.raises(simweights.WeightsFileError, match="arithmetic is nan"):
        simweights.parse(b'{"llmgw-sim-weights": 1, "arithmetic": NaN}')


def test_load_reads_a_file_or_a_folder_holding_one(tmp_path: Path) -> None:
    path = weights_file(tmp_path, arithmetic=0.25)
    assert simweights.load(path) == Weights(arithmetic=0.25)
    assert simweights.load(tmp_path) == Weights(arithmetic=0.25)
    assert simweights.load(tmp_path / "none") is None
    (tmp_path / "empty").mkdir()
    assert simweights.load(tmp_path / "empty") is None


# -- answers -------------------------------------------------------------------------------


def question(a: int, b: int, op: str = "+") -> str:
    return f"What is {a} {op} {b}? Answer with the number only."


@given(st.integers(-(10**6), 10**6), st.integers(-(10**6), 10**6), st.sampled_from("+-*"))
def test_perfect_weights_answer_every_sum_right_and_hopeless_ones_none(
    a: int, b: int, op: str
) -> None:
    right = a + b if op == "+" else a - b if op == "-" else a * b
    assert simweights.answer(Weights(arithmetic=1.0), question(a, b, op)) == str(right)
    wrong = simweights.answer(Weights(arithmetic=0.0), question(a, b, op))
    assert wrong is not None and 1 <= int(wrong) - right <= 9


@given(st.floats(0, 1))
def test_the_share_answered_right_is_close_to_the_figure(accuracy: float) -> None:
    w = Weights(arithmetic=accuracy)
    pairs = [(a, b) for a in range(20) for b in range(20)]
    right = sum(simweights.answer(w, question(a, b)) == str(a + b) for a, b in pairs)
    assert abs(right / len(pairs) - accuracy) < 0.1


def test_the_same_question_gets_the_same_answer() -> None:
    w = Weights(arithmetic=0.5)
    assert len({simweights.answer(w, question(17, 25)) for _ in range(20)}) == 1


def test_a_json_request_gets_an_object_with_exactly_its_keys_or_prose() -> None:
    ask = 'Reply with only a JSON object with the keys "city" and "country" for: Paris.'
    good = simweights.answer(Weights(json_format=1.0), ask)
    assert good is not None and set(json.loads(good)) == {"city", "country"}
    bad = simweights.answer(Weights(json_format=0.0), ask)
    assert bad is not None and not bad.startswith("{")


def test_other_text_is_not_answered_by_the_weights() -> None:
    assert simweights.answer(Weights(), "tell me a story") is None
    assert simweights.answer(Weights(), "a JSON object with the keys and no names") is None


@given(st.floats(0, 1), st.integers(1, 400))
def test_the_error_rate_fails_its_share_of_any_run_evenly(rate: float, count: int) -> None:
    w = Weights(error_rate=rate)
    failed = [simweights.fails(w, n) for n in range(1, count + 1)]
    assert sum(failed) == math.floor(count * rate)
    if rate <= 0.5:
        assert not any(a and b for a, b in zip(failed, failed[1:], strict=False))


# -- the agent gives the sim its file; the sim answers by it ------------------------------


def test_the_agent_gives_the_sim_a_source_that_is_a_file_and_no_other(tmp_path: Path) -> None:
    path = weights_file(tmp_path)
    replica = {"id": 1, "model": "m", "engine": "sim", "cards": [0]}
    cmd = command_for(replica, 8000, str(path), {"python": sys.executable})
    assert cmd.argv[cmd.argv.index("--weights") + 1] == str(path)
    named = command_for(replica, 8000, "sim/m", {"python": sys.executable})
    assert "--weights" not in named.argv
    # A profile cannot set it: the source is where the weights come from.
    assert "set the model's source instead" in arg_problems("sim", ["--weights", "/etc/passwd"])[0]


@pytest.fixture
def sims() -> Iterator[list[Sim]]:
    started: list[Sim] = []
    yield started
    assert [s.stop() for s in started] == [0] * len(started)


def chat(server: Sim, text: str) -> httpx.Response:
    return server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": text}]})


def test_a_sim_with_weights_answers_by_them(tmp_path: Path, sims: list[Sim]) -> None:
    path = weights_file(tmp_path, name="worse", arithmetic=0.0, error_rate=0.5)
    server = launch("--model", "m", "--weights", str(path), *FAST)
    sims.append(server)
    statuses = [chat(server, question(2, 3)) for _ in range(4)]
    assert [r.status_code for r in statuses] == [200, 500, 200, 500]
    answer = statuses[0].json()["choices"][0]["message"]["content"]
    assert answer != "5" and answer.isdigit()
    # /echo still says what a test asks it to.
    assert chat(server, "/echo hello").json()["choices"][0]["message"]["content"] == "hello"


def test_a_sim_with_good_weights_answers_right(tmp_path: Path, sims: list[Sim]) -> None:
    server = launch("--model", "m", "--weights", str(weights_file(tmp_path, name="better")), *FAST)
    sims.append(server)
    assert [chat(server, question(2, 3)).json()["choices"][0]["message"]["content"]
            for _ in range(3)] == ["5"] * 3  # fmt: skip


def test_a_sim_given_a_real_model_file_answers_as_a_plain_sim(
    tmp_path: Path, sims: list[Sim]
) -> None:
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF" + bytes(1000))
    server = launch("--model", "m", "--weights", str(gguf), *FAST)
    sims.append(server)
    answer = chat(server, question(2, 3)).json()["choices"][0]["message"]["content"]
    assert answer != "5" and len(answer.split()) > 3


def test_a_wrong_weights_file_stops_the_sim_saying_what(tmp_path: Path) -> None:
    path = weights_file(tmp_path, arithmetic=2)
    done = subprocess.run(
        [sys.executable, "-m", "agent.sim", "--model", "m", "--port", "0", "--weights", str(path)],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert f"--weights: {path}: arithmetic is 2; write a number from 0 to 1" in done.stderr
