"""The runtime package's import graph: plugins import the plugin base only, the registry imports the plugins, the
framework imports the registry; no circle, and no import hidden inside a function to get round one."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import trainjob.runtime

ROOT = Path(trainjob.runtime.__file__).parent
MODULES = {
    ".".join(["trainjob.runtime", *path.relative_to(ROOT).with_suffix("").parts]).removesuffix(".__init__"): path
    for path in ROOT.rglob("*.py")
}


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(module imported, inside a function) for every ``trainjob.runtime`` import outside ``if TYPE_CHECKING``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped = {
        id(node)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
        for node in ast.walk(block)
    }
    in_function = {
        id(node)
        for func in ast.walk(tree)
        if isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef)
        for node in ast.walk(func)
    }
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        for name in names:
            while name and name not in MODULES:
                name = name.rpartition(".")[0]
            if name:
                found.append((name, id(node) in in_function))
    return found


GRAPH = {module: {name for name, _ in _imports(path)} - {module} for module, path in MODULES.items()}


def _reaches(start: str, goal: str) -> bool:
    seen, todo = set(), [start]
    while todo:
        current = todo.pop()
        for nxt in GRAPH[current]:
            if nxt == goal:
                return True
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return False


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_runtime_module_imports_itself_back(module):
    assert not _reaches(module, module), f"{module} is on an import circle"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_runtime_import_is_hidden_in_a_function(module):
    assert [name for name, hidden in _imports(MODULES[module]) if hidden] == []


def test_plugins_import_the_plugin_base_not_the_framework_or_registry():
    # torchtune is part of the torch plugin (as torchtune.go is of Kubeflow's), not a plugin of its own.
    helpers = ["trainjob.runtime.plugins.torchtune"]
    plugins = [m for m in MODULES if m.startswith("trainjob.runtime.plugins.") and m not in helpers]
    assert len(plugins) == 7
    for helper in helpers:
        assert not {"trainjob.runtime.framework", "trainjob.runtime.registry"} & GRAPH[helper], helper
    for plugin in plugins:
        assert "trainjob.runtime.plugin" in GRAPH[plugin]
        assert not {"trainjob.runtime.framework", "trainjob.runtime.registry"} & GRAPH[plugin], plugin
    assert not any(_reaches("trainjob.runtime.plugin", plugin) for plugin in plugins)
    assert "trainjob.runtime.registry" in GRAPH["trainjob.runtime.framework"]


def test_render_imports_no_plugin_constants():
    source = (ROOT / "render.py").read_text(encoding="utf-8")
    assert "TRAINJOB_NAME_LABEL" not in source and "_API_VERSION" not in source
