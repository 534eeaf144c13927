#!/usr/bin/env python3
"""Regenerate agent/flags/<engine>.json: every flag each engine's own parser takes.

The tables are read from the engines' sources, never by importing them (vLLM and SGLang
import torch and CUDA libraries on the way to their parsers):

- vllm: the wheel's ``vllm/engine/arg_utils.py`` (``EngineArgs.add_cli_args``: each
  ``add_argument`` call, its kwargs from ``get_kwargs(<Config>)`` by the field's type, as
  ``_compute_kwargs`` maps types) and ``vllm/entrypoints/common/cli_args.py`` (the
  frontend's dataclass fields and ``make_arg_parser``'s own calls). Several versions may
  be given: the table is their union and each flag lists the versions that take it.
- sglang: the wheel's ``sglang/srt/arg_groups/*.py`` and ``server_args.py``: every
  ``A[T, Arg(...)]`` field (``add_cli_args_from_dataclass``) and the explicit calls.
- llamacpp: ``common/arg.cpp`` of the llama.cpp that scripts/build-llama-server.sh builds
  (the llama-cpp-python sdist's ``vendor/llama.cpp``): each ``add_opt(common_arg(...))``
  that llama-server takes (its examples), its names, negations, values and ``set_env``.
- trtllm: ``tensorrt_llm/commands/serve.py``'s ``serve`` command (click options).
- sim: agent.sim's own argparse parser.

Usage (downloads with pip when no path is given)::

    python3 scripts/engine-flags.py --vllm 0.33.0 --vllm 0.10.2 --sglang 0.5.23 \\
        --llama-cpp-python 0.3.36 --llama-cpp-python 0.3.16 --sim \\
        --trtllm-serve PATH/serve.py --trtllm-version VERSION

Only the engines named are rewritten. What each flag is to the catalog (the agent's own,
one naming a file or source, or allowed) is decided in agent/flags/__init__.py, not here.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "agent" / "flags"


CACHE: Path | None = None  # --downloads: where earlier downloads are looked for first


def _download(spec: str, dest: Path, binary: bool) -> Path:
    name, version = spec.split("==")
    stem = f"{name.replace('-', '_')}-{version}"
    if CACHE is not None:
        for found in sorted(CACHE.rglob(f"{stem}*")) + sorted(CACHE.rglob(f"{name}-{version}*")):
            if found.suffix in (".whl", ".gz"):
                return found
    dest.mkdir(parents=True, exist_ok=True)
    kind = ["--only-binary", ":all:"] if binary else ["--no-binary", ":all:"]
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", *kind, spec, "-d", str(dest)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return next(p for p in dest.iterdir() if p.is_file())


def _unpack(archive: Path, dest: Path, members: str) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    if archive.suffix == ".whl":
        with zipfile.ZipFile(archive) as z:
            for name in z.namelist():
                if name.startswith(members) and name.endswith((".py", ".cpp", ".h")):
                    z.extract(name, dest)
    else:
        with tarfile.open(archive) as t:
            t.extractall(dest, filter="data")
    return dest


def _write(engine: str, table: dict) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    table["flags"].sort(key=lambda f: f["names"][0].lstrip("-"))
    if "env" in table:
        table["env"] = sorted(set(table["env"]))
    path = OUT / f"{engine}.json"
    path.write_text(json.dumps(table, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    sys.stderr.write(f"{path.relative_to(ROOT)}: {len(table['flags'])} flags\n")


def _flag(names, value, repeat=False):
    return {"names": list(dict.fromkeys(names)), "value": value, "repeat": bool(repeat)}


# -- Python sources: dataclass fields and add_argument calls --------------------------


def _classes(root: Path) -> tuple[dict[str, ast.ClassDef], dict[str, str]]:
    """Return every class of a package by name, and its module-level type aliases."""
    classes: dict[str, ast.ClassDef] = {}
    aliases: dict[str, str] = {}
    # The config and argument modules first: a model file may reuse a config's name.
    files = sorted(
        root.rglob("*.py"),
        key=lambda f: (
            not any(
                part in ("config", "engine", "entrypoints")
                for part in f.relative_to(root).parts[:1]
            ),
            str(f),
        ),
    )
    for f in files:
        try:
            tree = ast.parse(f.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                classes.setdefault(node.name, node)
            elif isinstance(node, ast.Assign) and len(node.targets) == 1:
                t = node.targets[0]
                if isinstance(t, ast.Name) and t.id[:1].isupper():
                    aliases.setdefault(t.id, ast.unparse(node.value))
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                if node.value is not None and "TypeAlias" in ast.unparse(node.annotation):
                    aliases.setdefault(node.target.id, ast.unparse(node.value))
            elif type(node).__name__ == "TypeAlias":  # Python 3.12's `type X = ...`
                aliases.setdefault(node.name.id, ast.unparse(node.value))
    return classes, aliases


def _fields(cls: str, classes: dict[str, ast.ClassDef]) -> dict[str, ast.AnnAssign]:
    node = classes.get(cls)
    if node is None:
        return {}
    out: dict[str, ast.AnnAssign] = {}
    for base in node.bases:
        name = ast.unparse(base).split(".")[-1].split("[")[0]
        if name != cls:
            out.update(_fields(name, classes))
    for stmt in node.body:
        if (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and not ast.unparse(stmt.annotation).startswith("ClassVar")
        ):
            out[stmt.target.id] = stmt
    return out


def _resolve(annotation: str, aliases: dict[str, str], depth: int = 4) -> str:
    for _ in range(depth):
        new = re.sub(
            r"\b[A-Z]\w*\b",
            lambda m: f"({aliases[m.group(0)]})" if m.group(0) in aliases else m.group(0),
            annotation,
        )
        if new == annotation:
            break
        annotation = new
    return annotation


def _words(annotation: str) -> set[str]:
    # What a type mentions outside Literal[...] (whose values are not types).
    return set(re.findall(r"\b\w+\b", re.sub(r"Literal\[[^\]]*\]", "Literal", annotation)))


def _vllm_value(annotation: str, classes, aliases) -> str:
    """Return how vLLM's _compute_kwargs makes a field of this type take its value."""
    words = _words(_resolve(annotation, aliases))
    dataclasses = {
        w
        for w in words
        if w in classes
        and any(
            "dataclass" in ast.unparse(d) or "config" in ast.unparse(d)
            for d in classes[w].decorator_list
        )
    }
    if dataclasses:
        return "one"  # JSON
    if (
        {"bool", "str", "None"} == words & {"bool", "str", "None", "int", "float", "dict", "list"}
        and "bool" in words
        and "str" in words
    ):
        return "optional"
    if "bool" in words:
        return "switch"
    if "Literal" in words and not words & {"list", "tuple", "set"}:
        return "one"
    if words & {"tuple", "list", "set"}:
        return "many"
    return "one"


def _explicit_value(kw: dict[str, str], fallback: str) -> tuple[str, bool]:
    action = kw.get("action", "").strip("'\"")
    nargs = kw.get("nargs", "").strip("'\"")
    if action == "append":
        return ("many" if nargs in ("+", "*") else "one"), True
    if action in ("store_true", "store_false", "store_const", "count", "help", "version"):
        return "none", False
    if "BooleanOptionalAction" in action:
        return "switch", False
    if nargs == "?":
        return "optional", False
    if nargs in ("+", "*") or nargs.isdigit() and int(nargs) > 1:
        return "many", False
    if action and "Deprecated" in action and "StoreTrue" in action:
        return "none", False
    if "type" in kw or "choices" in kw or "nargs" in kw:
        return "one", False
    return fallback, False


def _negations(names: list[str]) -> list[str]:
    return [f"--no-{n[2:]}" for n in names if n.startswith("--")]


def _calls(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
            yield node


def _vllm_table(root: Path) -> list[dict]:
    classes, aliases = _classes(root)
    flags: list[dict] = []
    tree = ast.parse((root / "engine" / "arg_utils.py").read_text(encoding="utf-8"))
    # X_kwargs = get_kwargs(Config) (or get_kwargs(Config)["field"]), in order.
    sources: dict[str, tuple[str, str | None]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            v = node.value
            sub = None
            if isinstance(v, ast.Subscript) and isinstance(v.slice, ast.Constant):
                sub, v = v.slice.value, v.value
            if isinstance(v, ast.Call) and getattr(v.func, "id", None) == "get_kwargs":
                sources[node.targets[0].id] = (ast.unparse(v.args[0]), sub)
    cli = root / "entrypoints" / "common" / "cli_args.py"
    if not cli.exists():  # before 0.2x: the OpenAI server's own
        cli = root / "entrypoints" / "openai" / "cli_args.py"
    trees = [tree, ast.parse(cli.read_text(encoding="utf-8"))]
    for t in trees:
        for call in _calls(t):
            names = [
                a.value
                for a in call.args
                if isinstance(a, ast.Constant) and str(a.value).startswith("-")
            ]
            if not names:
                continue
            kw = {k.arg: ast.unparse(k.value) for k in call.keywords if k.arg}
            fallback = "one"
            spread = [k.value for k in call.keywords if k.arg is None]
            for d in [v for v in spread if isinstance(v, ast.Dict)]:
                spread += [v for key, v in zip(d.keys, d.values, strict=False) if key is None]
                kw.update(
                    {
                        key.value: ast.unparse(v)
                        for key, v in zip(d.keys, d.values, strict=False)
                        if isinstance(key, ast.Constant)
                    }
                )
            kw.pop("default", None)
            for sub in spread:
                if isinstance(sub, ast.Subscript):
                    holder = ast.unparse(sub.value)
                    field = sub.slice.value if isinstance(sub.slice, ast.Constant) else None
                    if holder in sources and field:
                        cls, sub = sources[holder]
                        f = _fields(cls, classes).get(sub or field)
                        if f is not None:
                            fallback = _vllm_value(ast.unparse(f.annotation), classes, aliases)
            value, repeat = _explicit_value(kw, fallback)
            if value == "switch":
                flags.append(_flag(names + _negations(names), "none"))
            else:
                flags.append(_flag(names, value, repeat))
    # The frontend's dataclass fields: each --field-name, with _customize_cli_kwargs's
    # extra "flags" and actions read from its source.
    custom = ast.parse(cli.read_text(encoding="utf-8"))
    extra: dict[str, dict[str, str]] = {}
    for node in ast.walk(custom):
        # frontend_kwargs["field"]["key"] = value
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Subscript):
            t = node.targets[0]
            if isinstance(t.value, ast.Subscript) and isinstance(t.slice, ast.Constant):
                inner = t.value
                if isinstance(inner.slice, ast.Constant) and isinstance(inner.slice.value, str):
                    extra.setdefault(inner.slice.value, {})[t.slice.value] = ast.unparse(node.value)
    for cls in ("FrontendArgs",):
        for name, f in _fields(cls, classes).items():
            if name.startswith("_"):
                continue
            names = [f"--{name.replace('_', '-')}"]
            more = extra.get(name, {})
            if "flags" in more:
                names = re.findall(r"'(-[^']+)'|\"(-[^\"]+)\"", more["flags"])
                names = [a or b for a, b in names] + [f"--{name.replace('_', '-')}"]
            fallback = _vllm_value(ast.unparse(f.annotation), classes, aliases)
            # A custom action or type keeps the field's own nargs (lora_modules).
            more = {k: v for k, v in more.items() if k in ("nargs", "action")}
            if "action" in more and more["action"].strip("'\"") not in ("append", "store_true"):
                more.pop("action")
            value, repeat = _explicit_value(more, fallback)
            if value == "switch":
                flags.append(_flag(names + _negations(names), "none"))
            else:
                flags.append(_flag(names, value, repeat))
    return flags


def _vllm_env(root: Path) -> list[str]:
    tree = ast.parse((root / "envs.py").read_text(encoding="utf-8"))
    for node in tree.body:
        target = getattr(node, "target", None) or (getattr(node, "targets", None) or [None])[0]
        if getattr(target, "id", None) == "environment_variables" and isinstance(
            node.value, ast.Dict
        ):
            return [k.value for k in node.value.keys if isinstance(k, ast.Constant)]
    return []


def vllm(versions: list[str], work: Path) -> None:
    merged: dict[str, dict] = {}
    env: dict[str, list[str]] = {}
    sources = []
    for version in versions:
        wheel = _download(f"vllm=={version}", work / f"vllm-{version}", binary=True)
        root = _unpack(wheel, work / f"vllm-{version}-src", "vllm/") / "vllm"
        sources.append(f"vllm {version} wheel from PyPI ({wheel.name})")
        for f in _vllm_table(root):
            key = f["names"][0]
            held = merged.setdefault(key, {**f, "versions": []})
            held["names"] = list(dict.fromkeys(held["names"] + f["names"]))
            held["versions"].append(version)
        for name in _vllm_env(root):
            env.setdefault(name, []).append(version)
    table = {
        "engine": "vllm",
        "program": "vllm serve",
        "versions": versions,
        "source": "; ".join(sources)
        + ": vllm/engine/arg_utils.py (EngineArgs.add_cli_args, field types as "
        "_compute_kwargs maps them), vllm/entrypoints/common/cli_args.py (FrontendArgs, "
        "make_arg_parser), vllm/envs.py (environment_variables)",
        "underscores": True,
        "equals": True,
        "flags": list(merged.values()),
        "env": list(env),
    }
    _write("vllm", table)


# -- SGLang ------------------------------------------------------------------------------


def _sglang_table(root: Path) -> list[dict]:
    srt = root / "srt"
    files = sorted((srt / "arg_groups").rglob("*.py")) + [srt / "server_args.py"]
    flags: list[dict] = []
    seen: set[str] = set()
    for f in files:
        tree = ast.parse(f.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                ann = node.annotation
                if not (
                    isinstance(ann, ast.Subscript) and ast.unparse(ann.value) in ("A", "Annotated")
                ):
                    continue
                parts = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
                if len(parts) < 2:
                    continue
                inner, meta = parts[0], parts[1:]
                arg = next(
                    (m for m in meta if isinstance(m, ast.Call) and ast.unparse(m.func) == "Arg"),
                    None,
                )
                if arg is None and not any(
                    isinstance(m, ast.Constant) and isinstance(m.value, str) for m in meta
                ):
                    continue
                kw = {k.arg: ast.unparse(k.value) for k in (arg.keywords if arg else []) if k.arg}
                if kw.get("no_cli") == "True":
                    continue
                name = node.target.id
                cli = kw.get("cli_name", "").strip("'\"") or f"--{name.replace('_', '-')}"
                names = [cli] + [
                    a or b
                    for a, b in re.findall(r"'(-[^']+)'|\"(-[^\"]+)\"", kw.get("aliases", ""))
                ]
                typ = ast.unparse(inner)
                words = _words(typ)
                if "action" in kw:
                    action = kw["action"]
                    if "append" in action:
                        value, repeat = "one", True
                    elif re.search(
                        r"store_true|StoreTrue|store_false|store_const|StoreConst", action
                    ):
                        value, repeat = "none", False
                        if "nargs" in kw and kw.get("action_kwargs", "").find("nargs") >= 0:
                            value = "optional"
                    elif "BooleanOptional" in action:
                        names += _negations(names)
                        value, repeat = "none", False
                    else:
                        value, repeat = _explicit_value({**kw, "action": ""}, "one")
                elif (
                    "Literal" in typ.split("[")[0] or typ.startswith("Literal") or "Literal[" in typ
                ):
                    value, repeat = "one", False
                elif (
                    re.match(r"(Optional\[)?list\[", typ)
                    or re.search(r"\blist\[", typ)
                    and "type_parser" not in kw
                ):
                    nargs = kw.get("nargs", "'+'").strip("'\"")
                    value, repeat = ("optional" if nargs == "?" else "many"), False
                elif words & {"bool"} and not words & {"str", "int", "float", "dict", "list"}:
                    value, repeat = "none", False
                else:
                    nargs = kw.get("nargs", "").strip("'\"")
                    value = {"?": "optional", "+": "many", "*": "many"}.get(nargs, "one")
                    repeat = False
                if cli in seen:
                    continue
                seen.add(cli)
                flags.append(_flag(names, value, repeat))
        for call in _calls(tree):
            names = [
                a.value
                for a in call.args
                if isinstance(a, ast.Constant) and str(a.value).startswith("-")
            ]
            if not names or names[0] in seen:
                continue
            kw = {k.arg: ast.unparse(k.value) for k in call.keywords if k.arg}
            value, repeat = _explicit_value(kw, "one")
            if value == "switch":
                names += _negations(names)
                value = "none"
            seen.add(names[0])
            flags.append(_flag(names, value, repeat))
    return flags


def _sglang_env(root: Path) -> list[str]:
    tree = ast.parse((root / "srt" / "environ.py").read_text(encoding="utf-8"))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "Envs":
            for stmt in node.body:
                target = (
                    getattr(stmt, "target", None) or (getattr(stmt, "targets", None) or [None])[0]
                )
                name = getattr(target, "id", "")
                if re.fullmatch(r"SGL(ANG)?_[A-Z0-9_]+", name):
                    out.append(name)
    return out


def sglang(version: str, work: Path) -> None:
    wheel = _download(f"sglang=={version}", work / "sglang", binary=True)
    root = _unpack(wheel, work / "sglang-src", "sglang/srt/") / "sglang"
    _write(
        "sglang",
        {
            "engine": "sglang",
            "program": "python -m sglang.launch_server",
            "versions": [version],
            "source": f"sglang {version} wheel from PyPI ({wheel.name}): "
            "sglang/srt/arg_groups/*.py and server_args.py (add_cli_args_from_dataclass's "
            "A[T, Arg(...)] fields, and the explicit add_argument calls), "
            "sglang/srt/environ.py (Envs)",
            "underscores": False,
            "equals": True,
            "flags": _sglang_table(root),
            "env": _sglang_env(root),
        },
    )


# -- llama.cpp ---------------------------------------------------------------------------


def _balanced(text: str, start: int) -> int:
    """Return the index just past the parenthesis closing the one at ``start``."""
    depth, i, n = 0, start, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            i += 1
            while text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif c == "'":
            i += 1
            while text[i] != "'":
                i += 2 if text[i] == "\\" else 1
        elif c == "/" and text[i + 1] == "/":
            i = text.index("\n", i)
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise ValueError("unbalanced")


def _llama_table(arg_cpp: Path) -> tuple[list[dict], list[dict]]:
    text = arg_cpp.read_text(encoding="utf-8")
    flags, env = [], []
    for m in re.finditer(r"add_opt\(common_arg\(", text):
        block = text[m.start() : _balanced(text, m.start() + len("add_opt"))]
        examples = re.findall(r"set_examples\(\{([^}]*)\}\)", block)
        excludes = re.findall(r"set_excludes\(\{([^}]*)\}\)", block)
        ex = " ".join(examples)
        if examples and "LLAMA_EXAMPLE_SERVER" not in ex and "LLAMA_EXAMPLE_COMMON" not in ex:
            continue
        if "LLAMA_EXAMPLE_SERVER" in " ".join(excludes):
            continue
        lists = re.findall(r"\{((?:\s*\"[^\"]*\"\s*,?)+)\}", block[: block.find("[](")])
        names = re.findall(r"\"([^\"]*)\"", lists[0]) if lists else []
        neg = re.findall(r"\"([^\"]*)\"", lists[1]) if len(lists) > 1 else []
        if not names:
            continue
        lam = re.search(r"\[\]\s*\(([^)]*)\)", block)
        params = [p.strip() for p in lam.group(1).split(",")] if lam else []
        if len(params) >= 3:
            value = "two"
        elif len(params) == 2 and params[1].startswith("bool"):
            value = "none"
        elif len(params) == 2:
            value = "one"
        else:
            value = "none"
        if "is_preset_only" in block and "is_preset_only = true" in block:
            continue
        flags.append(_flag(names + neg, value))
        e = re.search(r"set_env\(\"([^\"]+)\"\)", block)
        if e:
            env.append({"name": e.group(1), "flag": names[-1]})
    return flags, env


def llamacpp(versions: list[str], work: Path) -> None:
    """The union of the given llama-cpp-python releases' llama-server flags; each flag
    lists the releases that take it, and how it takes a value is the first release's
    (the newest: give it first)."""
    merged: dict[str, dict] = {}
    env: dict[str, dict] = {}
    sources = []
    for version in versions:
        sdist = _download(f"llama-cpp-python=={version}", work / f"llama-{version}", binary=False)
        root = _unpack(sdist, work / f"llama-{version}-src", "")
        arg_cpp = next(root.glob("llama_cpp_python-*/vendor/llama.cpp/common/arg.cpp"))
        sources.append(f"llama-cpp-python {version} sdist from PyPI ({sdist.name})")
        flags, envs = _llama_table(arg_cpp)
        for f in flags:
            held = next((merged[n] for n in f["names"] if n in merged), None)
            if held is None:
                held = {**f, "versions": []}
            held["names"] = list(dict.fromkeys(held["names"] + f["names"]))
            if version not in held["versions"]:
                held["versions"].append(version)
            for n in held["names"]:
                merged[n] = held
        for e in envs:
            env.setdefault(e["name"], e)
    unique = list({id(f): f for f in merged.values()}.values())
    _write(
        "llamacpp",
        {
            "engine": "llamacpp",
            "program": "llama-server",
            "versions": [f"llama.cpp vendored by llama-cpp-python {v}" for v in versions],
            "source": "; ".join(sources)
            + ": vendor/llama.cpp/common/arg.cpp, the add_opt(common_arg(...)) calls "
            "llama-server takes (LLAMA_EXAMPLE_SERVER or COMMON, not excluded); a flag "
            "given twice keeps only its last value there (it warns), so none repeats",
            "underscores": True,
            "equals": False,
            "flags": unique,
            "env_flags": list(env.values()),
            "env": list(env),
        },
    )


# -- TensorRT-LLM ------------------------------------------------------------------------


def trtllm(serve_py: Path, version: str, origin: str) -> None:
    tree = ast.parse(serve_py.read_text(encoding="utf-8"))
    flags = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "serve":
            for dec in node.decorator_list:
                if isinstance(dec, ast.Call) and ast.unparse(dec.func) == "click.option":
                    names = [
                        a.value
                        for a in dec.args
                        if isinstance(a, ast.Constant) and a.value.startswith("-")
                    ]
                    kw = {k.arg: ast.unparse(k.value) for k in dec.keywords}
                    value = "none" if kw.get("is_flag") == "True" else "one"
                    flags.append(_flag(names, value, kw.get("multiple") == "True"))
    _write(
        "trtllm",
        {
            "engine": "trtllm",
            "program": "trtllm-serve",
            "versions": [version],
            "source": f"{origin}: tensorrt_llm/commands/serve.py, the serve command's "
            "click options (click takes no abbreviation; a flag given twice keeps its "
            "last value unless multiple=True)",
            "underscores": False,
            "equals": True,
            "flags": flags,
            "env": [],
        },
    )


# -- sim ---------------------------------------------------------------------------------


def sim() -> None:
    sys.path.insert(0, str(ROOT))
    # Imported here: after the project's root is on sys.path.
    from agent import simconfig as simulator  # noqa: PLC0415

    parser = simulator.build_parser()
    flags = []
    for action in parser._actions:
        if not action.option_strings or action.option_strings[0] in ("-h", "--version"):
            continue
        value = "none" if action.nargs == 0 else "optional" if action.nargs == "?" else "one"
        flags.append(_flag(action.option_strings, value))
    _write(
        "sim",
        {
            "engine": "sim",
            "program": "python -m agent.sim",
            "versions": [simulator.SIM_VERSION],
            "source": "agent/simconfig.py build_parser(), this repository",
            "underscores": False,
            "equals": True,
            "flags": flags,
            "env": [
                f"LLMGW_SIM_{a.dest.upper()}"
                for a in parser._actions
                if a.option_strings and a.dest not in ("help", "version")
            ],
        },
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vllm", action="append", default=[], metavar="VERSION")
    p.add_argument("--sglang", metavar="VERSION")
    p.add_argument("--llama-cpp-python", action="append", default=[], metavar="VERSION")
    p.add_argument("--trtllm-serve", type=Path, metavar="PATH")
    p.add_argument("--trtllm-version", default="")
    p.add_argument("--trtllm-origin", default="TensorRT-LLM's repository")
    p.add_argument("--sim", action="store_true")
    p.add_argument(
        "--downloads", type=Path, help="a folder to look for the wheels and sdists in first"
    )
    args = p.parse_args()
    global CACHE
    CACHE = args.downloads
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if args.vllm:
            vllm(args.vllm, work)
        if args.sglang:
            sglang(args.sglang, work)
        if args.llama_cpp_python:
            llamacpp(args.llama_cpp_python, work)
        if args.trtllm_serve:
            trtllm(args.trtllm_serve, args.trtllm_version, args.trtllm_origin)
        if args.sim:
            sim()
    return 0


if __name__ == "__main__":
    sys.exit(main())
