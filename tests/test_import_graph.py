"""trainjob's modules import each other without circles, and each layer only imports the layers below it.

The graph is read from the source: every ``import`` and ``from ... import``, at module level or inside a function
(an import moved into a function to dodge a circle still counts), except those under ``if TYPE_CHECKING:``. Importing
``a.b.c`` also depends on the package ``a.b``, whose ``__init__`` runs first. The top package ``trainjob`` is left out as a target: its ``__init__``
runs before any of its modules and loads the SDK's names lazily.

The layers, as :data:`LAYER_RULES` checks them (what a module reaches through any chain of imports):

==========================================  ======================================================================
``trainjob.torch`` (inside training)        no backend, no CLI, no ``TrainerClient``, no tool (``trainjob.tools``
                                            uses the training library, not the other way round)
``trainjob.runtime``                        no backend, no CLI, no ``TrainerClient``, nothing of what runs in a
                                            Ray pod (``trainjob.ray``)
``trainjob.backends``                       no CLI, no ``TrainerClient``: they speak the SDK's types, below it
``trainjob.sdk`` but ``trainjob.sdk.client``  no backend, no CLI (``TrainerClient`` is the one that picks a backend)
``trainjob.backends.kubernetes``            not the local backend: what both need lives in ``trainjob.backends``
``trainjob.backends.local.supervisor``      not the local backend's client (``LocalBackend``): the daemon is below
                                            the client; what both do (start a supervisor, admit queued jobs) is the
                                            supervisor's
``trainjob.progress`` (in every rank)       no SDK, no backend, no CLI: the SDK's ``Progress`` is defined here
``trainjob.settings``                       no backend (the local backend reads the settings, not the reverse)
``trainjob.initializers`` (in a pod)         no backend, no SDK, no CLI, no runtime, no training library: both
                                            backends run it, and an initializer pod imports only what it needs
``trainjob.cli``, ``trainjob.ui``           of the local backend only its package, ``trainjob.backends.local``
                                            (``local_backend`` and a few public functions), or the SDK's
                                            ``TrainerClient``, which picks a backend; the rest through the
                                            backend's methods
==========================================  ======================================================================

A rule may name modules its package may import whose own imports are not held against it (``through``): the
CLI imports ``trainjob.backends.local`` and ``trainjob.sdk.client``, and what they import is the backend's
business, not the CLI's.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

import trainjob

ROOT = Path(trainjob.__file__).resolve().parent


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package under ``root``."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _type_checking_imports(tree: ast.AST) -> set[int]:
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return skipped


def _imported_names(module: str, is_package: bool, node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = module.split(".") if is_package else module.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join([*package, *([base] if base else [])])
    return [base, *(f"{base}.{alias.name}" for alias in node.names)]


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the trainjob modules it imports (nearest enclosing module of each imported name)."""
    top = next(iter(modules)).split(".")[0]
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skipped = _type_checking_imports(tree)
        deps: set[str] = set()
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom) or id(node) in skipped:
                continue
            for name in _imported_names(module, path.name == "__init__.py", node):
                while name and name not in modules:
                    name = name.rpartition(".")[0]
                if name and name not in (module, top) and not module.startswith(name + "."):
                    deps.add(name)  # a module's own packages are already running when it is imported
        for dep in list(deps):  # a submodule's packages run their __init__ first
            parts = dep.split(".")
            for i in range(2, len(parts)):
                package = ".".join(parts[:i])
                if package != top and not module.startswith(package + ".") and package != module:
                    deps.add(package)
        graph[module] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(start: str) -> None:  # iterative, so deep graphs do not hit the recursion limit
        work: list[tuple[str, Iterable[str]]] = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(iter(children), None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


class LayerRule(NamedTuple):
    """Modules of ``package`` (but those in ``exempt``) reach nothing in ``forbidden`` through any chain of imports;
    a chain stops at a module of ``through``, which they may import, and at its packages."""

    package: str
    forbidden: tuple[str, ...]
    exempt: tuple[str, ...] = ()
    through: tuple[str, ...] = ()


LAYER_RULES: list[LayerRule] = [
    LayerRule("trainjob.torch", ("trainjob.backends", "trainjob.cli", "trainjob.sdk.client", "trainjob.tools")),
    LayerRule("trainjob.runtime", ("trainjob.backends", "trainjob.cli", "trainjob.sdk.client", "trainjob.ray")),
    LayerRule("trainjob.backends", ("trainjob.cli", "trainjob.sdk.client")),
    LayerRule("trainjob.sdk", ("trainjob.backends", "trainjob.cli"), exempt=("trainjob.sdk.client",)),
    LayerRule("trainjob.backends.kubernetes", ("trainjob.backends.local",)),
    LayerRule("trainjob.backends.local.supervisor", ("trainjob.backends.local.client",)),
    LayerRule("trainjob.progress", ("trainjob.sdk", "trainjob.backends", "trainjob.cli")),
    LayerRule("trainjob.initializers", ("trainjob.backends", "trainjob.sdk", "trainjob.cli", "trainjob.runtime",
                                        "trainjob.torch")),
    LayerRule("trainjob.settings", ("trainjob.backends",)),
    LayerRule("trainjob.cli", ("trainjob.backends.local",), through=("trainjob.backends.local", "trainjob.sdk.client")),
    LayerRule("trainjob.ui", ("trainjob.backends.local",), through=("trainjob.backends.local", "trainjob.sdk.client")),
]


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def import_chain(
    graph: dict[str, set[str]], start: str, targets: tuple[str, ...], through: tuple[str, ...] = ()
) -> list[str] | None:
    """The shortest chain of imports from ``start`` to a module inside one of ``targets``, not going on from a
    module of ``through`` or one of its packages; ``None`` if none."""
    stops = {".".join(parts[:i]) for name in through for parts in [name.split(".")] for i in range(1, len(parts) + 1)}
    came_from: dict[str, str | None] = {start: None}
    queue = [start]
    for module in queue:  # breadth first: the queue grows while it is walked
        for dep in sorted(graph.get(module, ())):
            if dep in came_from:
                continue
            came_from[dep] = module
            if dep in stops:
                continue
            if any(_within(dep, target) for target in targets):
                chain = [dep]
                while (previous := came_from[chain[-1]]) is not None:
                    chain.append(previous)
                return chain[::-1]
            queue.append(dep)
    return None


def layer_violations(graph: dict[str, set[str]], rules: list[LayerRule]) -> list[list[str]]:
    """For each module that reaches a package its rule forbids, the chain of imports that gets there."""
    found = []
    for package, forbidden, exempt, through in rules:
        for module in sorted(graph):
            if _within(module, package) and not any(_within(module, e) for e in exempt):
                chain = import_chain(graph, module, forbidden, through)
                if chain is not None:
                    found.append(chain)
    return found


def test_the_graph_reader_finds_a_circle(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("from pkg.sub.b import B\n")
    (package / "a.py").write_text("def f():\n    from pkg.sub import b\n")  # in a function: still counts
    (package / "sub" / "b.py").write_text("from pkg import a\nB = 1\n")
    (package / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import a\n")
    graph = import_graph(module_files(package))
    assert graph["pkg.c"] == set()
    assert cycles(graph) == [["pkg.a", "pkg.sub", "pkg.sub.b"]]


def test_trainjob_has_no_import_cycles() -> None:
    found = cycles(import_graph(module_files()))
    assert found == [], "modules that import each other in a circle:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_layer_check_finds_an_import_through_a_neutral_module(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    for sub in ("torch", "backends", "sdk"):
        (package / sub).mkdir(parents=True)
        (package / sub / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "torch" / "metrics.py").write_text("from pkg import progress\n")
    (package / "progress.py").write_text("def f():\n    from pkg.backends import rootcause\n")
    (package / "backends" / "rootcause.py").write_text("")
    (package / "sdk" / "client.py").write_text("from pkg.backends import rootcause\n")
    rules = [LayerRule("pkg.torch", ("pkg.backends",)), LayerRule("pkg.sdk", ("pkg.backends",), ("pkg.sdk.client",))]
    found = layer_violations(import_graph(module_files(package)), rules)
    assert found == [["pkg.torch.metrics", "pkg.progress", "pkg.backends"]]  # its __init__ runs first


def test_each_layer_imports_only_the_layers_below_it() -> None:
    found = layer_violations(import_graph(module_files()), LAYER_RULES)
    assert found == [], "imports against the layers (see this module's docstring):\n" + "\n".join(
        " -> ".join(chain) for chain in found
    )


def test_a_rule_lets_a_package_through_its_public_face_only(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    for sub in ("cli", "local", "local/client"):
        (package / sub).mkdir(parents=True, exist_ok=True)
        (package / sub / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "local" / "__init__.py").write_text("def backend():\n    from pkg.local.client import store\n")
    (package / "local" / "client" / "store.py").write_text("")
    (package / "cli" / "main.py").write_text("from pkg import local\n")
    (package / "cli" / "logs.py").write_text("from pkg.local.client import store\n")
    rules = [LayerRule("pkg.cli", ("pkg.local",), through=("pkg.local",))]
    found = layer_violations(import_graph(module_files(package)), rules)
    assert found == [["pkg.cli.logs", "pkg.local.client"]]  # the client package's __init__ runs first
