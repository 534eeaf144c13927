"""The house's rule, held: imports point one way, and receivers are connected in one place.

An AST walk of every module of the layers (every import, function-level ones included;
nothing is imported or run) that fails naming the file, the line and the imported name:

- against the direction ``agent`` ← ``catalog`` ← ``cluster`` ← ``guard`` ← ``gateway`` ←
  ``updates`` ← ``llmgw_admin``: a layer imports only itself and the layers before it (a lower layer
  lets a higher one act through a signal the higher one connects in its
  ``AppConfig.ready()``);
- Django (or a package built on it) imported in ``agent``, which runs on nodes without it;
- the two kinds of ``llmgw_admin`` module crossing. ``FRAMEWORK`` is what every app builds
  on (roles, the API base, htmx helpers, lean-route helpers, tokens, settings helpers):
  it imports no app and no wiring, and any app may import it. ``WIRING`` is the project on
  top (settings, urls, the ASGI routing, the console's home and live view, the server, the
  commands, the demo): it imports any app, and no app imports it. A module of
  ``llmgw_admin`` in neither list fails: say which it is here;
- a signal receiver connected outside its app's ``signals.py``, or connected at import
  time (at a module's top level, or by ``@receiver``): each app connects its receivers
  in a function its ``AppConfig.ready()`` calls. A connect is a ``.connect(...)`` call
  given ``sender=``, ``dispatch_uid=`` or ``weak=`` (as every one here is; a socket's
  connect takes none).

docs/development.md ("The import direction") explains the rule and the two kinds.
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

# llmgw_admin's modules by kind, named below the package ("management" and "migrations"
# hold everything under them). "__init__" is the package itself, which every import of
# a module of it runs: it loads the Celery app, itself framework (it imports no app).
FRAMEWORK = {
    "__init__",
    "api",  # the API's error shape and parsers
    "celery",  # the Celery app the apps' tasks bind to
    "env",  # reading LLMGW_* settings
    "events",  # the live-event bus, each app's events registered in its ready()
    "htmx",  # typing of htmx requests
    "lean",  # helpers of the routes that skip Django's stack
    "migrations",
    "models",  # API tokens
    "pagination",  # the API's page limits
    "batches",  # writing in batches off the request path, by a thread
    "refused",  # the base of every app's refusal
    "roles",  # roles for views, the API, the admin
    "security",  # response headers
    "tokens",  # API token authentication
    "upstream",  # the one async HTTP client: engines, providers and judges
}
WIRING = {
    "admin",  # users, groups and tokens in the admin; the admin's sign-in
    "api_views",  # the tokens' API
    "apps",  # the project app's ready(): registers the cluster's inventory with the catalog
    "asgi",  # the ASGI application: HTTP, lean routes, websockets
    "consumer",  # the live view's websocket consumer (reads every app's renderers)
    "context_processors",
    "dashboard",  # the console's home page
    "demo",  # the first start's simulated nodes and demo catalog
    "hub",  # the live view's one subscription per process
    "jobs",  # the periodic jobs, for beat and the embedded threads
    "management",  # init, serve, token, user
    "routing",  # the websocket routes
    "server",  # the web process's server
    "settings",
    "status_views",
    "throttle",  # the sign-in's throttle
    "token_views",
    "urls",
}


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
    for layer in LAYERS:
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


def kind(dotted: str) -> str | None:
    """Return "framework" or "wiring" for a module of llmgw_admin, None when unlisted."""
    rest = dotted.split(".")[1:] or ["__init__"]
    if rest[0] in FRAMEWORK:
        return "framework"
    if rest[0] in WIRING:
        return "wiring"
    return None


def problem(module: Module, line: int, name: str) -> str | None:
    """Return what is wrong with ``module`` importing ``name``, or None."""
    src, top = module.layer, name.split(".")[0]
    if src == "agent" and top in DJANGO:
        return "agent imports nothing of Django: it runs on nodes without it"
    if top not in RANK or top == src and src != "llmgw_admin":
        return None
    if src == "llmgw_admin":
        if kind(module.name) != "framework":
            return None  # wiring imports what it wires
        if top != "llmgw_admin":
            return (
                f"{module.name} is framework (apps build on it) and imports no app: "
                "move what it needs into llmgw_admin's framework, or have the app hand it in"
            )
        if kind(name) == "wiring":
            return f"{module.name} is framework and imports no wiring ({name} imports apps)"
        return None
    if top == "llmgw_admin":
        if kind(name) == "wiring":
            return (
                f"{name} is llmgw_admin's wiring, which no app imports: "
                "move what the app needs into the app, or into llmgw_admin's framework"
            )
        return None  # framework: every app builds on it
    if RANK[top] > RANK[src]:
        return (
            f"{src} may not import {top} ({' <- '.join(LAYERS)}): send a signal from "
            f"{src}/signals.py that {top} connects in its AppConfig.ready()"
        )
    return None


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


def test_a_module_of_llmgw_admin_is_framework_or_wiring_and_not_both() -> None:
    assert not FRAMEWORK & WIRING
    found = {m.name for m in modules() if m.layer == "llmgw_admin"}
    unlisted = sorted(n for n in found if kind(n) is None)
    assert not unlisted, (
        "llmgw_admin modules in neither FRAMEWORK nor WIRING of "
        f"tests/test_import_direction.py: {unlisted}: list each as one or the other"
    )
    tops = {(n.split(".")[1:] or ["__init__"])[0] for n in found}
    assert not (FRAMEWORK | WIRING) - tops, f"listed but gone: {(FRAMEWORK | WIRING) - tops}"


def test_every_import_points_down_the_layers() -> None:
    found = []
    for module in modules():
        tree = parsed(module.path)
        for line, name in imported(module, tree):
            why = problem(module, line, name)
            if why:
                found.append(f"{module.path}:{line}: imports {name}: {why}")
    assert not found, "imports against the direction:\n" + "\n".join(found)


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
