"""The house's rule, held: imports point one way, and receivers are connected in one place.

An AST walk of every module of the layers (every import, function-level ones included;
nothing is imported or run) that fails naming the file, the line and the imported name:

- against the direction ``agent`` ← ``catalog`` ← ``cluster`` ← ``guard`` ← ``gateway`` ←
  ``updates`` ← ``llmgw_admin``: a layer imports only itself and the layers before it (a lower layer
  lets a higher one act through a signal the higher one connects in its
  ``AppConfig.ready()``);
- Django (or a package built on it, the framework ``llmgw_core`` too) imported in
  ``agent``, which runs on nodes without it;
- the framework, ``llmgw_core`` (roles, the API base, htmx helpers, lean-route helpers,
  tokens, settings helpers, the live-event bus, the Celery app, the HTTP client),
  importing an app or the wiring: it imports none of the layers, and any app but
  ``agent`` may import it. ``llmgw_admin`` is the wiring on top (settings, urls, the ASGI
  routing, the console's home and live view, the server, the commands, the demo): it
  imports any app, and no app imports it (it is the last layer);
- a signal receiver connected outside its app's ``signals.py``, or connected at import
  time (at a module's top level, or by ``@receiver``): each app connects its receivers
  in a function its ``AppConfig.ready()`` calls. A connect is a ``.connect(...)`` call
  given ``sender=``, ``dispatch_uid=`` or ``weak=`` (as every one here is; a socket's
  connect takes none).

- the gateway's request path (``gateway/path/``) importing the ORM or the recorders: no
  ``django.db``, no ``*.models``, and of ``gateway/records/`` only the record types it
  hands over (``gateway.records.observe``'s), so no query can reach the path by an import.

docs/development.md ("The import direction") explains the rule.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Lowest first: each may import only itself and the ones before it.
LAYERS = ("agent", "catalog", "cluster", "guard", "gateway", "updates", "llmgw_admin")
APPS = LAYERS[:-1]
RANK = {name: i for i, name in enumerate(LAYERS)}

# Packages that are Django or run on it: none of them in agent.
DJANGO = {
    "django",
    "rest_framework",
    "channels",
    "channels_redis",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_filters",
    "django_htmx",
    "template_partials",
    "celery",
}

# The framework every app builds on: it imports no layer (tests below).
FRAMEWORK = "llmgw_core"


@dataclass(frozen=True)
class Module:
    path: Path  # relative to ROOT
    name: str  # dotted
    package: str  # the package its relative imports start from

    @property
    def layer(self) -> str:
        return self.name.split(".")[0]


def modules() -> list[Module]:
    out = []
    for layer in (*LAYERS, FRAMEWORK):
        base = ROOT / layer
        if not base.is_dir():  # gateway arrives with its issue
            continue
        for path in sorted(base.rglob("*.py")):
            rel = path.relative_to(ROOT)
            parts = list(rel.with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
                package = ".".join(parts)
            else:
                package = ".".join(parts[:-1])
            out.append(Module(rel, ".".join(parts), package))
    return out


@functools.cache
def parsed(path: Path) -> ast.Module:
    """Return a module's syntax tree (read once for every test here)."""
    return ast.parse((ROOT / path).read_text(), str(path))


def is_module(dotted: str) -> bool:
    path = ROOT.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imported(module: Module, tree: ast.AST) -> list[tuple[int, str]]:
    """Return each imported module (line, dotted name); ``from a import b`` names ``a.b``
    when that is a module, else ``a``."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.package.split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            for alias in node.names:
                full = f"{source}.{alias.name}"
                out.append((node.lineno, full if is_module(full) else source))
    return sorted(set(out))


def problem(module: Module, line: int, name: str) -> str | None:
    """Return what is wrong with ``module`` importing ``name``, or None."""
    src, top = module.layer, name.split(".")[0]
    if src == "agent" and (top in DJANGO or top == FRAMEWORK):
        return "agent imports nothing of Django: it runs on nodes without it"
    if src == FRAMEWORK:
        if top in RANK:
            return (
                f"{FRAMEWORK} is the framework (every app builds on it) and imports no app "
                "and not the wiring: move what it needs into it, or have the app hand it in "
                "(a registration in the app's AppConfig.ready())"
            )
        return None
    if top not in RANK or top == src:
        return None
    if RANK[top] > RANK[src]:
        if top == "llmgw_admin":
            return (
                "llmgw_admin is the wiring, which no app imports: move what the app needs "
                f"into the app, or into the framework ({FRAMEWORK})"
            )
        return (
            f"{src} may not import {top} ({' <- '.join(LAYERS)}): send a signal from "
            f"{src}/signals.py that {top} connects in its AppConfig.ready()"
        )
    return None


# The gateway's request path, and what it may take of the recorders: the record types it
# hands over and the listener it hands them to.
PATH = "gateway.path"
RECORDS = "gateway.records"
HANDED_OVER = {"gateway.records.observe": {"Done", "RefusalHeard", "Listener", "Observer"}}


def path_problems(module: Module, tree: ast.AST) -> list[tuple[int, str, str]]:
    """Return each import of a module of the request path that it may not make:
    (line, imported name, why)."""
    if module.name != PATH and not module.name.startswith(PATH + "."):
        return []
    found = []
    for line, name in imported(module, tree):
        if name == "django.db" or name.startswith("django.db."):
            found.append((line, name, "the request path makes no query: no django.db"))
        elif name.endswith(".models") or ".models." in name:
            found.append((line, name, "the request path makes no query: no *.models"))
        elif (name == RECORDS or name.startswith(RECORDS + ".")) and name not in HANDED_OVER:
            found.append(
                (
                    line,
                    name,
                    "the request path takes of gateway.records only the "
                    f"record types it hands over ({', '.join(sorted(HANDED_OVER))})",
                )
            )
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in HANDED_OVER:
            extra = {a.name for a in node.names} - HANDED_OVER[node.module]
            if extra:
                found.append(
                    (
                        node.lineno,
                        f"{node.module}.{sorted(extra)[0]}",
                        "not a record type the path hands over",
                    )
                )
    return found


def connects(tree: ast.Module) -> list[tuple[int, str, bool]]:
    """Return each signal connect: (line, what, at import time)."""
    out: list[tuple[int, str, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for d in node.decorator_list:
                target = d.func if isinstance(d, ast.Call) else d
                if (isinstance(target, ast.Name) and target.id == "receiver") or (
                    isinstance(target, ast.Attribute) and target.attr == "receiver"
                ):
                    out.append((d.lineno, f"@receiver on {node.name}", True))
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "connect"
            and {k.arg for k in node.keywords} & {"sender", "dispatch_uid", "weak"}
        ):
            out.append((node.lineno, ast.unparse(node.func), not in_function))
        inner = in_function or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        for child in ast.iter_child_nodes(node):
            visit(child, inner or isinstance(node, ast.Lambda))

    visit(tree, False)
    return out


def test_the_framework_holds_only_what_imports_no_layer() -> None:
    """The framework is a package of its own beside the layers, and the wiring holds none
    of it: a module of llmgw_admin that an app imports fails the walk below."""
    found = [m for m in modules() if m.layer == FRAMEWORK]
    assert found, f"{FRAMEWORK}/ has no module"
    assert FRAMEWORK not in LAYERS


def test_the_walk_finds_an_import_against_the_framework_rule() -> None:
    """The rule can fail: a framework module importing an app, an app importing the
    wiring, the agent importing the framework are each named."""
    core = Module(Path(FRAMEWORK, "x.py"), f"{FRAMEWORK}.x", FRAMEWORK)
    app = Module(Path("cluster", "x.py"), "cluster.x", "cluster")
    agent = Module(Path("agent", "x.py"), "agent.x", "agent")
    assert problem(core, 1, "cluster.models")
    assert problem(core, 1, "llmgw_admin.settings")
    assert problem(app, 1, "llmgw_admin.demo")
    assert problem(agent, 1, f"{FRAMEWORK}.roles")
    assert problem(app, 1, f"{FRAMEWORK}.roles") is None
    assert problem(core, 1, f"{FRAMEWORK}.refused") is None


def test_every_import_points_down_the_layers() -> None:
    found = []
    for module in modules():
        tree = parsed(module.path)
        for line, name in imported(module, tree):
            why = problem(module, line, name)
            if why:
                found.append(f"{module.path}:{line}: imports {name}: {why}")
    assert not found, "imports against the direction:\n" + "\n".join(found)


def test_the_request_path_imports_no_orm_and_no_recorder() -> None:
    """``gateway/path/`` imports no ``django.db``, no ``*.models`` and of
    ``gateway/records/`` only the record types it hands over."""
    found = [m for m in modules() if m.name.startswith(PATH + ".")]
    assert len(found) > 20, f"{PATH} has {len(found)} modules"
    problems = [
        f"{module.path}:{line}: imports {name}: {why}"
        for module in found
        for line, name, why in path_problems(module, parsed(module.path))
    ]
    assert not problems, "the request path imports against its rule:\n" + "\n".join(problems)


def test_the_walk_finds_an_import_against_the_paths_rule() -> None:
    """The path's rule can fail: the ORM, a model, a recorder or a name of the record
    types' module that is not a record type is named; a record type is not."""
    path = Module(Path("gateway", "path", "x.py"), "gateway.path.x", "gateway.path")
    outside = Module(Path("gateway", "x.py"), "gateway.x", "gateway")
    bad = ast.parse(
        "from django.db import connection\n"
        "from gateway.models import ClientKey\n"
        "from gateway.records import usage\n"
        "from gateway.records.observe import Done, Fanout\n"
        "from catalog import models\n"
    )
    got = [(line, name) for line, name, _ in path_problems(path, bad)]
    assert got == [
        (1, "django.db"),
        (2, "gateway.models"),
        (3, "gateway.records.usage"),
        (5, "catalog.models"),
        (4, "gateway.records.observe.Fanout"),
    ]
    good = ast.parse("from gateway.records.observe import Done, RefusalHeard\n")
    assert path_problems(path, good) == []
    assert path_problems(outside, bad) == []


def gateway_holders(module: Module, tree: ast.AST) -> list[tuple[int, str]]:
    """Return each parameter of a function of ``module`` that holds a gateway untyped or
    whole: named ``gateway``, ``gw`` or ``owner`` and typed ``Any`` (or not typed), or
    typed ``Gateway`` in the path outside ``app.py``, where it is made."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        args = node.args
        for arg in (*args.posonlyargs, *args.args, *args.kwonlyargs):
            kind = ast.unparse(arg.annotation) if arg.annotation is not None else ""
            if arg.arg in ("gateway", "gw", "owner") and kind in ("", "Any"):
                found.append((arg.lineno, f"{node.name}({arg.arg}: {kind or 'untyped'})"))
            elif (
                kind == "Gateway"
                and module.name.startswith(PATH + ".")
                and (module.name != PATH + ".app")
            ):
                found.append((arg.lineno, f"{node.name}({arg.arg}: Gateway)"))
    return found


def test_no_part_of_the_gateway_holds_the_whole_gateway_untyped() -> None:
    """The request path's parts take the gateway's typed ``Parts`` (or the few
    collaborators each needs), never the ``Gateway``; nothing in ``gateway/`` holds a
    gateway typed ``Any``."""
    found = [
        f"{module.path}:{line}: {what}: take gateway.path.parts.Parts or what it needs"
        for module in modules()
        if module.layer == "gateway"
        for line, what in gateway_holders(module, parsed(module.path))
    ]
    assert not found, "a gateway held whole:\n" + "\n".join(found)
    bad = ast.parse("def f(gateway: Any) -> None: ...\ndef g(x: Gateway) -> None: ...\n")
    path = Module(Path("gateway", "path", "x.py"), "gateway.path.x", "gateway.path")
    assert [line for line, _ in gateway_holders(path, bad)] == [1, 2]


def test_every_receiver_is_connected_in_its_apps_signals_when_the_app_is_ready() -> None:
    found = []
    for module in modules():
        tree = parsed(module.path)
        home = module.path == Path(module.layer, "signals.py")
        for line, what, at_import in connects(tree):
            if not home:
                found.append(
                    f"{module.path}:{line}: {what}: connect {module.layer}'s receivers in "
                    f"{module.layer}/signals.py, in the function its AppConfig.ready() calls"
                )
            elif at_import:
                found.append(
                    f"{module.path}:{line}: {what}: connected at import time; connect it in "
                    "the function AppConfig.ready() calls"
                )
    assert not found, "receivers out of place:\n" + "\n".join(found)
