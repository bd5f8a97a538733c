"""Every cross-reference in the code's docstrings and comments and in the docs (``:mod:``, ``:func:``, ``:class:``,
``:data:``, ``:meth:``) names an object that exists, so a rename or a removal cannot leave a dangling one.

A reference resolves as Sphinx resolves it: ``~`` only shortens the text; a name is looked up in the module that
holds it, then as an absolute path; a name in a class's docstring is first looked up in that class; a leading ``.`` looks it up from the
module's package upwards, never by suffix (``:mod:`.status``` in ``trainjob.backends.kubernetes.reconcile`` is
``trainjob.backends.kubernetes.status``).
Names a module imports only for type checking count as its names. The package is read from its source, not
imported; a name outside it counts when it is a builtin or its top-level module is installed.
"""

from __future__ import annotations

import ast
import builtins
import functools
import importlib.util
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PACKAGE = "trainjob"
ROLE = re.compile(r":(mod|func|class|data|meth):`([^`]+)`")


def module_name(path: Path) -> str | None:
    """``src/trainjob/a/b.py`` -> ``trainjob.a.b`` (``None`` for a file outside ``src/``)."""
    if SRC not in path.parents:
        return None
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def references(path: Path) -> list[tuple[int, str, str]]:
    """(line, role, target) of every role in ``path``'s text."""
    text = path.read_text(encoding="utf-8")
    found = []
    for match in ROLE.finditer(text):
        target = match[2]
        if "<" in target and target.endswith(">"):  # :func:`title <target>`
            target = target[target.index("<") + 1:-1]
        found.append((text.count("\n", 0, match.start()) + 1, match[1], target.lstrip("~!")))
    return found


def enclosing_classes(path: Path, line: int) -> list[str]:
    """The dotted names of the classes around ``line`` of a Python file, innermost first (``A.B``, ``A``)."""
    if path.suffix != ".py":
        return []
    names: list[str] = []

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef) and node.lineno <= line <= (node.end_lineno or node.lineno):
                names.insert(0, f"{prefix}{node.name}")
                visit(node.body, f"{prefix}{node.name}.")

    visit(_tree(path).body, "")
    return names


@functools.cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


# -- the package's names, read from its source (nothing is imported) -----------------------------------------------


@dataclass
class Scope:
    """The names a module or class defines: to ``None`` (defined here) or the dotted path an import binds."""

    names: dict[str, str | None] = field(default_factory=dict)
    classes: dict[str, Scope] = field(default_factory=dict)
    bases: dict[str, list[str]] = field(default_factory=dict)  # class -> its bases, as written


def _file_of(module: str) -> Path | None:
    base = SRC.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _absolute(module: str, is_package: bool, level: int, name: str | None) -> str:
    parts = module.split(".")
    keep = len(parts) - level + (1 if is_package else 0)
    return ".".join([*parts[:keep], *([name] if name else [])])


def _read(body: list[ast.stmt], module: str, is_package: bool, scope: Scope, lazy: bool = False) -> None:
    for node in body:
        if isinstance(node, ast.ClassDef):
            inner = Scope()
            _read(node.body, module, is_package, inner)
            scope.names[node.name] = None
            scope.classes[node.name] = inner
            scope.bases[node.name] = [ast.unparse(base) for base in node.bases]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            scope.names[node.name] = None
            if node.name == "__getattr__":  # a module's lazy names: what its __getattr__ imports
                _read(node.body, module, is_package, scope, lazy=True)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and not lazy:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        scope.names[name.id] = None
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict) and \
                    any(isinstance(t, ast.Name) and t.id == "_EXPORTS" for t in node.targets):
                for key, value in zip(node.value.keys, node.value.values, strict=True):
                    if isinstance(key, ast.Constant) and isinstance(value, ast.Constant):
                        where = value.value if "." in value.value else _absolute(module, is_package, 1, value.value)
                        scope.names.setdefault(key.value, f"{where}.{key.value}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                scope.names[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else \
                    alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(module, is_package, node.level, node.module) if node.level else str(node.module)
            for alias in node.names:
                scope.names.setdefault(alias.asname or alias.name, f"{source}.{alias.name}")
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            for part in ("body", "orelse", "finalbody", "handlers"):
                for child in getattr(node, part, []):
                    _read(child.body if isinstance(child, ast.ExceptHandler) else [child], module, is_package,
                          scope, lazy)


@functools.cache
def module_scope(module: str) -> Scope | None:
    path = _file_of(module)
    if path is None:
        return None
    scope = Scope()
    _read(ast.parse(path.read_text(encoding="utf-8")).body, module, path.name == "__init__.py", scope)
    return scope


def _outside(path: str) -> bool:
    """Whether ``path``, a name outside this package, exists: a builtin, or a module that is installed."""
    top = path.split(".")[0]
    if "." not in path:
        return hasattr(builtins, path) or importlib.util.find_spec(top) is not None
    return importlib.util.find_spec(top) is not None


def lookup(path: str, depth: int = 0) -> bool:
    """Whether dotted ``path`` names a module of this package, a name one defines or imports, or a member of a class
    it defines (or of its bases)."""
    parts = path.split(".")
    if parts[0] != PACKAGE:
        return _outside(path)
    if depth > 20:
        return False
    module = PACKAGE
    for i, part in enumerate(parts[1:], start=1):
        if _file_of(f"{module}.{part}") is not None:
            module = f"{module}.{part}"
            continue
        scope = module_scope(module)
        if scope is None or part not in scope.names:
            return False
        bound = scope.names[part]
        rest = parts[i + 1:]
        if bound is not None:
            return lookup(".".join([bound, *rest]), depth + 1)
        return not rest or (part in scope.classes and _member(module, scope, part, rest, depth))
    return _file_of(module) is not None


def _member(module: str, scope: Scope, cls: str, rest: list[str], depth: int) -> bool:
    inner = scope.classes[cls]
    if rest[0] in inner.names:
        bound = inner.names[rest[0]]
        if bound is not None:
            return lookup(".".join([bound, *rest[1:]]), depth + 1)
        return len(rest) == 1 or (rest[0] in inner.classes and _member(module, inner, rest[0], rest[1:], depth))
    for base in scope.bases.get(cls, []):
        base = base.split("[")[0]
        head = base.split(".")[0]
        where = f"{module}.{base}" if head in scope.names else base
        if head in scope.names and scope.names[head] is not None:
            where = ".".join([str(scope.names[head]), *base.split(".")[1:]])
        if not where.startswith(f"{PACKAGE}."):
            return True  # a member a class outside this package may give (pydantic, Exception, Protocol)
        if lookup(".".join([where, *rest]), depth + 1):
            return True
    return False


def resolves(target: str, module: str | None, classes: list[str] | None = None) -> bool:
    """Whether ``target``, written in ``module`` (``None``: in the docs) inside ``classes`` (innermost first),
    names an object."""
    scopes: list[str] = []
    if module is not None:
        package = module.split(".")
        scopes = [".".join(package[:cut]) for cut in range(len(package), 0, -1)]
    if target.startswith("."):
        bare = target.lstrip(".")
        return any(lookup(f"{scope}.{bare}") for scope in scopes)
    if module is not None and any(lookup(f"{module}.{cls}.{target}") for cls in classes or []):
        return True
    head = target.split(".")[0]
    if scopes and head in (module_scope(scopes[0]) or Scope()).names:
        return lookup(f"{scopes[0]}.{target}")
    return lookup(target)


def dangling(paths: list[Path]) -> list[str]:
    return [f"{path.relative_to(ROOT)}:{line}: :{role}:`{target}`"
            for path in paths for line, role, target in references(path)
            if not resolves(target, module_name(path), enclosing_classes(path, line))]


def source_files() -> list[Path]:
    return sorted([*(SRC / PACKAGE).rglob("*.py"), *(ROOT / "docs").rglob("*.md"), ROOT / "README.md"])


def test_every_reference_in_src_and_docs_names_an_object() -> None:
    assert dangling(source_files()) == []


@pytest.mark.parametrize(("written", "target", "ok"), [
    ("trainjob/backends/kubernetes/reconcile.py", ".status", True),
    ("trainjob/backends/kubernetes/reconcile.py", "~.progress.RESYNC_SECONDS", True),
    ("trainjob/backends/kubernetes/reconcile.py", "Reconciler.reconcile", True),
    ("trainjob/backends/kubernetes/reconcile.py", "KubeApi", True),
    ("trainjob/backends/kubernetes/reconcile.py", "trainjob.backends.stall.ProgressClock.overdue", True),
    ("trainjob/backends/kubernetes/reconcile.py", "ValueError", True),
    ("trainjob/backends/kubernetes/reconcile.py", ".launcher", False),
    ("trainjob/backends/kubernetes/reconcile.py", "Reconciler.render", False),
    ("trainjob/backends/kubernetes/reconcile.py", "trainjob.backends.mpi", False),
    ("trainjob/backends/kubernetes/reconcile.py", "NoSuchName", False),
])
def test_a_reference_resolves_from_where_it_is_written(written: str, target: str, ok: bool) -> None:
    assert resolves(target.lstrip("~"), module_name(SRC / written)) is ok
