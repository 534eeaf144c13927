"""Engine command lines: built from the desired replica, one engine at a time."""

from __future__ import annotations

import json
import re
import sys
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.engines import (
    AGENT_ROOT,
    ENGINES,
    KV_EVENTS_PORT_OFFSET,
    LORA_SCALED_COLON,
    RENDEZVOUS_PORT_OFFSET,
    RUNTIME_LORA_ENV,
    CommandError,
    command_for,
    default_binaries,
    extra_port_offsets,
    unsafe_args,
    unsafe_env,
)
from agent.flags import kinds, table

BINARIES = {
    "llama-server": "/opt/llama-server",
    "vllm": "/opt/venv/bin/vllm",
    "trtllm-serve": "/opt/venv/bin/trtllm-serve",
    "python": "/opt/venv/bin/python",
}


def replica(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "id": 42,
        "generation": 1,
        "model": "chat",
        "profile": "p",
        "engine": "vllm",
        "source": "org/chat-model",
        "served_name": "chat",
        "args": [],
        "env": {},
        "tp": 1,
        "pp": 1,
        "gpus_per_node": 1,
        "nodes": 1,
        "rank": 0,
        "leader": None,
        "cards": [0],
        "cpu_cores": 0,
        "adapters": [],
        "max_loaded_adapters": 0,
        "kv_events": False,
        "startup_timeout_s": 1200,
        "sha256": None,
        "context_length": 0,
        "guard": None,
    }
    base.update(over)
    return base


def flag(argv: list[str], name: str) -> str:
    """Return the value after a flag, failing when it is absent."""
    assert name in argv, f"{name} not in {argv}"
    return argv[argv.index(name) + 1]


# -- llama.cpp ---------------------------------------------------------------------------


def test_llamacpp_command_line_on_cpu() -> None:
    cmd = command_for(
        replica(engine="llamacpp", cards=[], cpu_cores=6, source="/m/small.gguf"),
        41234,
        "/m/small.gguf",
        BINARIES,
    )
    assert cmd.argv == [
        "/opt/llama-server",
        "-m",
        "/m/small.gguf",
        "--host",
        "127.0.0.1",
        "--port",
        "41234",
        "--alias",
        "chat",
        "-t",
        "6",
    ]
    # A CPU replica sees no card at all, rather than every card.
    assert cmd.env == {"CUDA_VISIBLE_DEVICES": ""}
    assert cmd.health_path == "/health"


def test_llamacpp_offloads_every_layer_to_its_cards() -> None:
    cmd = command_for(replica(engine="llamacpp", cards=[2, 3]), 1, "/m.gguf", BINARIES)
    assert flag(cmd.argv, "-ngl") == "999"
    assert "-t" not in cmd.argv  # no cpu_cores: the thread count is the engine's
    assert cmd.env["CUDA_VISIBLE_DEVICES"] == "2,3"


def test_llamacpp_reranks_only_for_a_rerank_model() -> None:
    reranker = command_for(replica(engine="llamacpp", rerank=True), 1, "/m.gguf", BINARIES)
    assert "--reranking" in reranker.argv
    chat = command_for(replica(engine="llamacpp"), 1, "/m.gguf", BINARIES)
    assert "--reranking" not in chat.argv


def test_llamacpp_adapters_context_and_args_in_order() -> None:
    cmd = command_for(
        replica(
            engine="llamacpp",
            cards=[],
            adapters=[
                {"name": "sql", "source": "/lora/sql.gguf", "scale": 1.0},
                {"name": "tone", "source": "https://x/tone.gguf", "scale": 0.5},
            ],
            context_length=8192,
            args=["--jinja", "--parallel", "4"],
        ),
        9000,
        "/m.gguf",
        BINARIES,
        adapters={"tone": "/w/tone.gguf"},
    )
    tail = cmd.argv[cmd.argv.index("--alias") + 2 :]
    assert tail == [
        "--lora",
        "/lora/sql.gguf",
        "--lora-scaled",
        "/w/tone.gguf",
        "0.5",
        "--ctx-size",
        "8192",
        "--jinja",
        "--parallel",
        "4",
    ]


def test_llamacpp_newer_builds_take_scaled_adapters_as_one_argument() -> None:
    cmd = command_for(
        replica(engine="llamacpp", adapters=[{"name": "t", "source": "/t.gguf", "scale": 0.25}]),
        1,
        "/m.gguf",
        {**BINARIES, "llama-server-lora-scaled": LORA_SCALED_COLON},
    )
    assert flag(cmd.argv, "--lora-scaled") == "/t.gguf:0.25"


def test_llamacpp_refuses_to_span_nodes() -> None:
    with pytest.raises(CommandError, match="does not span nodes"):
        command_for(replica(engine="llamacpp", nodes=2), 1, "/m.gguf", BINARIES)


# -- vLLM --------------------------------------------------------------------------------


def test_vllm_command_line() -> None:
    cmd = command_for(
        replica(tp=4, pp=2, cards=[0, 1, 2, 3], args=["--max-model-len", "32768"]),
        8100,
        "org/chat-model",
        BINARIES,
    )
    assert cmd.argv == [
        "/opt/venv/bin/vllm",
        "serve",
        "org/chat-model",
        "--host",
        "127.0.0.1",
        "--port",
        "8100",
        "--served-model-name",
        "chat",
        "--tensor-parallel-size",
        "4",
        "--pipeline-parallel-size",
        "2",
        "--enable-prompt-tokens-details",
        "--max-model-len",
        "32768",
    ]
    assert cmd.env == {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}


def test_vllm_profile_env_kept_and_cards_set_last() -> None:
    cmd = command_for(replica(env={"VLLM_LOGGING_LEVEL": "INFO"}, cards=[5]), 1, "m", BINARIES)
    assert cmd.env == {"VLLM_LOGGING_LEVEL": "INFO", "CUDA_VISIBLE_DEVICES": "5"}


def test_vllm_mig_instance_named_by_uuid() -> None:
    cmd = command_for(replica(cards=[8]), 1, "m", BINARIES, devices={8: "MIG-abc"})
    assert cmd.env["CUDA_VISIBLE_DEVICES"] == "MIG-abc"


def test_vllm_adapters_loaded_at_start() -> None:
    cmd = command_for(
        replica(
            adapters=[
                {"name": "chat-sql", "source": "/lora/sql", "scale": 1.0},
                {"name": "chat-de", "source": "/lora/de", "scale": 1.0},
            ]
        ),
        1,
        "m",
        BINARIES,
    )
    i = cmd.argv.index("--enable-lora")
    assert cmd.argv[i : i + 6] == [
        "--enable-lora",
        "--lora-modules",
        "chat-sql=/lora/sql",
        "chat-de=/lora/de",
        "--max-loras",
        "2",
    ]
    assert RUNTIME_LORA_ENV not in cmd.env


def test_vllm_adapters_loaded_on_demand_from_a_folder() -> None:
    cmd = command_for(
        replica(
            adapters=[{"name": "chat-sql", "source": "/lora/sql", "scale": 1.0}],
            max_loaded_adapters=3,
        ),
        1,
        "m",
        BINARIES,
        adapter_dir="/state/adapters/42",
    )
    assert "--lora-modules" not in cmd.argv
    assert flag(cmd.argv, "--max-loras") == "3"
    assert cmd.env[RUNTIME_LORA_ENV] == "True"
    assert cmd.env["VLLM_PLUGINS"] == "lora_filesystem_resolver"
    assert cmd.env["VLLM_LORA_RESOLVER_CACHE_DIR"] == "/state/adapters/42"


def test_vllm_adapters_on_demand_need_a_folder() -> None:
    with pytest.raises(CommandError, match="folder"):
        command_for(
            replica(adapters=[{"name": "a", "source": "/a"}], max_loaded_adapters=1),
            1,
            "m",
            BINARIES,
        )


def test_vllm_kv_events() -> None:
    cmd = command_for(replica(kv_events=True), 8100, "m", BINARIES)
    config = json.loads(flag(cmd.argv, "--kv-events-config"))
    assert config == {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://*:{8100 + KV_EVENTS_PORT_OFFSET}",
    }
    assert flag(cmd.argv, "--prefix-caching-hash-algo") == "sha256_cbor"
    assert cmd.env["PYTHONHASHSEED"] == "0"
    assert extra_port_offsets(replica(kv_events=True)) == [KV_EVENTS_PORT_OFFSET]
    assert cmd.warnings == []


def test_vllm_kv_events_undone_by_args_is_said() -> None:
    cmd = command_for(
        replica(kv_events=True, args=["--prefix-caching-hash-algo=sha256"]), 1, "m", BINARIES
    )
    assert cmd.warnings == [
        "kv_events: the profile's --prefix-caching-hash-algo overrides what the router's "
        "KV index assumes; the index stays empty for this replica"
    ]


def test_vllm_kv_events_hash_seed_is_the_agents() -> None:
    cmd = command_for(replica(kv_events=True, env={"PYTHONHASHSEED": "7"}), 1, "m", BINARIES)
    assert cmd.env["PYTHONHASHSEED"] == "0"


def test_vllm_context_length_and_cpu_threads() -> None:
    cmd = command_for(replica(context_length=16384, cpu_cores=8), 1, "m", BINARIES)
    assert flag(cmd.argv, "--max-model-len") == "16384"
    assert cmd.env["OMP_NUM_THREADS"] == "8"


def test_vllm_multi_node_rank_0_serves_and_hosts_the_rendezvous() -> None:
    spec = replica(tp=8, pp=1, nodes=2, gpus_per_node=4, cards=[0, 1, 2, 3])
    cmd = command_for(spec, 8100, "m", BINARIES, node_address="gpu-07.cluster")
    assert flag(cmd.argv, "--distributed-executor-backend") == "mp"
    assert flag(cmd.argv, "--nnodes") == "2"
    assert flag(cmd.argv, "--node-rank") == "0"
    assert flag(cmd.argv, "--master-addr") == "gpu-07.cluster"
    assert flag(cmd.argv, "--master-port") == str(8100 + RENDEZVOUS_PORT_OFFSET)
    assert "--headless" not in cmd.argv
    assert cmd.health_path == "/health"
    assert extra_port_offsets(spec) == [RENDEZVOUS_PORT_OFFSET]


def test_vllm_multi_node_other_ranks_are_headless_and_meet_the_leader() -> None:
    spec = replica(tp=8, nodes=2, rank=1, leader="gpu-07.cluster:8100", cards=[0, 1, 2, 3])
    cmd = command_for(spec, 9300, "m", BINARIES)
    assert flag(cmd.argv, "--node-rank") == "1"
    assert flag(cmd.argv, "--master-addr") == "gpu-07.cluster"
    assert flag(cmd.argv, "--master-port") == str(8100 + RENDEZVOUS_PORT_OFFSET)
    assert "--headless" in cmd.argv
    assert cmd.health_path is None
    assert extra_port_offsets(spec) == []


def test_multi_node_rank_0_needs_this_nodes_address() -> None:
    with pytest.raises(CommandError, match="--advertise-address"):
        command_for(replica(nodes=2), 1, "m", BINARIES)


@pytest.mark.parametrize("leader", [None, "", "gpu-07", "gpu-07:http"])
def test_multi_node_rank_needs_a_leader_host_and_port(leader: str | None) -> None:
    with pytest.raises(CommandError, match="leader"):
        command_for(replica(nodes=2, rank=1, leader=leader), 1, "m", BINARIES)


# -- SGLang ------------------------------------------------------------------------------


def test_sglang_command_line() -> None:
    cmd = command_for(replica(engine="sglang", tp=2, cards=[0, 1]), 30000, "org/m", BINARIES)
    assert cmd.argv == [
        "/opt/venv/bin/python",
        "-m",
        "sglang.launch_server",
        "--model-path",
        "org/m",
        "--served-model-name",
        "chat",
        "--tp-size",
        "2",
        "--pp-size",
        "1",
        "--host",
        "127.0.0.1",
        "--port",
        "30000",
    ]
    assert cmd.env == {"CUDA_VISIBLE_DEVICES": "0,1"}


def test_sglang_multi_node() -> None:
    leader = command_for(
        replica(engine="sglang", tp=16, nodes=2), 30000, "m", BINARIES, node_address="10.1.2.3"
    )
    assert flag(leader.argv, "--nnodes") == "2"
    assert flag(leader.argv, "--node-rank") == "0"
    assert flag(leader.argv, "--dist-init-addr") == f"10.1.2.3:{30000 + RENDEZVOUS_PORT_OFFSET}"
    other = command_for(
        replica(engine="sglang", tp=16, nodes=2, rank=1, leader="10.1.2.3:30000"),
        31000,
        "m",
        BINARIES,
    )
    assert flag(other.argv, "--dist-init-addr") == f"10.1.2.3:{30000 + RENDEZVOUS_PORT_OFFSET}"
    assert other.health_path is None


def test_sglang_adapters_and_context() -> None:
    cmd = command_for(
        replica(
            engine="sglang",
            adapters=[{"name": "sql", "source": "/lora/sql"}],
            context_length=4096,
        ),
        1,
        "m",
        BINARIES,
    )
    i = cmd.argv.index("--enable-lora")
    assert cmd.argv[i : i + 5] == [
        "--enable-lora",
        "--lora-paths",
        "sql=/lora/sql",
        "--max-loras-per-batch",
        "1",
    ]
    assert flag(cmd.argv, "--context-length") == "4096"


# -- TensorRT-LLM ------------------------------------------------------------------------


def test_trtllm_command_line() -> None:
    cmd = command_for(
        replica(engine="trtllm", tp=2, pp=2, cards=[0, 1, 2, 3]), 8000, "/e", BINARIES
    )
    assert cmd.argv == [
        "/opt/venv/bin/trtllm-serve",
        "/e",
        "--host",
        "127.0.0.1",
        "--port",
        "8000",
        "--served_model_name",
        "chat",
        "--tp_size",
        "2",
        "--pp_size",
        "2",
    ]


def test_trtllm_refuses_nodes_and_adapters() -> None:
    with pytest.raises(CommandError, match="MPI"):
        command_for(replica(engine="trtllm", nodes=2), 1, "m", BINARIES)
    with pytest.raises(CommandError, match="adapters"):
        command_for(
            replica(engine="trtllm", adapters=[{"name": "a", "source": "/a"}]), 1, "m", BINARIES
        )


# -- the simulator -----------------------------------------------------------------------


def test_sim_command_line_uses_this_interpreter() -> None:
    cmd = command_for(
        replica(engine="sim", args=["--load-time", "2"], cards=[0]), 5000, "anything", None
    )
    assert cmd.argv == [
        sys.executable,
        "-m",
        "agent.sim",
        "--host",
        "127.0.0.1",
        "--port",
        "5000",
        "--model",
        "chat",
        "--load-time",
        "2",
    ]
    assert cmd.env == {"PYTHONPATH": AGENT_ROOT, "CUDA_VISIBLE_DEVICES": "0"}


def test_sim_as_a_judge() -> None:
    cmd = command_for(
        replica(engine="sim", guard={"format": "qwen3guard", "categories": ["Violent", "PII"]}),
        1,
        "x",
        None,
    )
    assert flag(cmd.argv, "--guard-format") == "qwen3guard"
    assert flag(cmd.argv, "--guard-categories") == "Violent,PII"


# -- what every engine shares ------------------------------------------------------------


def test_kv_events_only_for_vllm() -> None:
    with pytest.raises(CommandError, match="kv_events"):
        command_for(replica(engine="sglang", kv_events=True), 1, "m", BINARIES)


def test_unknown_engine_refused() -> None:
    with pytest.raises(CommandError, match="not one of"):
        command_for(replica(engine="ollama"), 1, "m", BINARIES)


def test_args_that_set_what_the_agent_sets_are_refused() -> None:
    with pytest.raises(CommandError, match="--port"):
        command_for(replica(args=["--port=9"]), 1, "m", BINARIES)


def test_env_that_picks_cards_is_refused() -> None:
    with pytest.raises(CommandError, match="CUDA_VISIBLE_DEVICES"):
        command_for(replica(env={"CUDA_VISIBLE_DEVICES": "0"}), 1, "m", BINARIES)


def test_custom_host() -> None:
    cmd = command_for(replica(), 7, "m", BINARIES, host="0.0.0.0")
    assert flag(cmd.argv, "--host") == "0.0.0.0"


def test_default_binaries_run_python_engines_with_this_interpreter() -> None:
    assert default_binaries()["python"] == sys.executable


# Each engine's switches (flags that take no value) an operator may pass, one name of
# each (aliases of one flag given together are the flag given twice).
SWITCHES = {
    e: sorted(
        {f.names[0] for n, f in table(e).flags.items() if f.value == "none" and n not in kinds(e)}
    )
    or ["--tps=9"]
    for e in ENGINES
}


@given(
    engine=st.sampled_from([e for e in ENGINES if e != "trtllm"]),
    cards=st.lists(st.integers(0, 15), max_size=8, unique=True),
    port=st.integers(1024, 65000),
    cpu=st.integers(0, 64),
    picks=st.lists(st.integers(0, 100), max_size=5, unique_by=lambda i: i % 7),
)
def test_every_engine_listens_where_told_on_the_cards_given(
    engine: str, cards: list[int], port: int, cpu: int, picks: list[int]
) -> None:
    args = list(dict.fromkeys(SWITCHES[engine][i % len(SWITCHES[engine])] for i in picks))
    spec = replica(engine=engine, cards=cards, cpu_cores=cpu, args=args)
    cmd = command_for(spec, port, "/w", BINARIES)
    assert flag(cmd.argv, "--port") == str(port)
    assert cmd.env["CUDA_VISIBLE_DEVICES"] == ",".join(str(c) for c in cards)
    # The profile's own arguments come last, as given.
    assert cmd.argv[len(cmd.argv) - len(args) :] == args
    assert unsafe_args(engine, args) is None
    for key in cmd.env:
        # The agent's own settings, which it refuses to take from a profile.
        if key not in ("CUDA_VISIBLE_DEVICES", "PYTHONPATH"):
            assert unsafe_env(key, engine) is None


@pytest.mark.parametrize(
    ("engine", "args", "says"),
    [
        ("vllm", ["--max-model-len"], 'takes a value: write "--max-model-len VALUE"'),
        ("vllm", ["--enforce-eager=1"], 'is a switch: write it without "=1"'),
        ("llamacpp", ["--chat-template-file", "/etc/shadow"], "names a file"),
        ("vllm", ["8192"], "a value with no flag before it"),
        ("vllm", ["--tensor-parallel=2"], 'is short for "--tensor-parallel-size"'),
        ("llamacpp", ["-a", "judge"], "sets what the agent sets"),
        ("llamacpp", ["--log-file", "/x"], "names a file"),
        ("llamacpp", ["--ctx-size", "2048", "--ctx-size", "999999999"], "given twice"),
        ("vllm", ["--max-modle-len", "8k"], 'did you mean "--max-model-len"'),
    ],
)
def test_argument_refusals_say_what_to_write(engine: str, args: list[str], says: str) -> None:
    why = unsafe_args(engine, args)
    assert why is not None and says in why
    with pytest.raises(CommandError, match=re.escape(says)):
        command_for(replica(engine=engine, args=args), 1, "m", BINARIES)


def test_one_refusal_per_fault_a_refused_flag_s_value_included() -> None:
    from agent.engines import arg_problems

    assert len(arg_problems("vllm", ["--api-key", "k", "--enforce-eager", "--port", "1"])) == 2


# -- engine keys -------------------------------------------------------------------------

KEY = "llmgw_engine_k3y"


@pytest.mark.parametrize(
    ("engine", "variable"),
    [("llamacpp", "LLAMA_API_KEY"), ("vllm", "VLLM_API_KEY"), ("sim", "LLMGW_SIM_API_KEY")],
)
def test_engine_key_goes_in_the_environment_where_the_engine_reads_it(
    engine: str, variable: str
) -> None:
    cmd = command_for(replica(engine=engine, engine_key=KEY), 8000, "/m", BINARIES)
    assert cmd.env[variable] == KEY
    # Never on the command line, which ps shows to every user of the node.
    assert not any(KEY in a for a in cmd.argv)
    assert not any(a.startswith("--api-key") for a in cmd.argv)


def test_sglang_takes_its_engine_key_on_the_command_line_only() -> None:
    cmd = command_for(replica(engine="sglang", engine_key=KEY), 8000, "/m", BINARIES)
    assert flag(cmd.argv, "--api-key") == KEY
    assert KEY not in cmd.env.values()


def test_trtllm_has_no_key_and_the_agent_says_its_port_is_open() -> None:
    cmd = command_for(replica(engine="trtllm", engine_key=KEY), 8000, "/m", BINARIES)
    assert not any(KEY in a for a in cmd.argv) and KEY not in cmd.env.values()
    assert any("takes no API key" in w for w in cmd.warnings)


@pytest.mark.parametrize("engine", ["llamacpp", "vllm", "sglang", "trtllm", "sim"])
def test_no_engine_key_from_an_older_control_plane_starts_the_engine_as_before(
    engine: str,
) -> None:
    cmd = command_for(replica(engine=engine), 8000, "/m", BINARIES)
    assert "--api-key" not in cmd.argv
    assert not {"LLAMA_API_KEY", "VLLM_API_KEY", "LLMGW_SIM_API_KEY"} & set(cmd.env)
    assert not cmd.warnings


@pytest.mark.parametrize(
    ("engine", "args", "env"),
    [
        ("llamacpp", ["--api-key", "mine"], {}),
        ("llamacpp", ["--api-key-file", "/etc/k"], {}),
        ("llamacpp", [], {"LLAMA_API_KEY": "mine"}),
        ("vllm", ["--api-key", "mine"], {}),
        ("vllm", [], {"VLLM_API_KEY": "mine"}),
        ("sglang", ["--api-key", "mine"], {}),
        ("sim", ["--api-key", "mine"], {}),
    ],
)
def test_a_catalog_cannot_set_or_replace_the_engine_key(
    engine: str, args: list[str], env: dict[str, str]
) -> None:
    with pytest.raises(CommandError):
        command_for(replica(engine=engine, args=args, env=env, engine_key=KEY), 1, "/m", BINARIES)


def test_the_agents_engine_key_wins_over_any_the_profile_gives() -> None:
    # The argument checks refuse the key variables (LLMGW_SIM_API_KEY with the
    # flag tables); whatever passes them, the agent's key is set last.
    for engine, variable in (("sim", "LLMGW_SIM_API_KEY"),):
        try:
            cmd = command_for(
                replica(engine=engine, env={variable: "mine"}, engine_key=KEY), 1, "/m", BINARIES
            )
        except CommandError:
            continue
        assert cmd.env[variable] == KEY
