"""What a ``trainjob check`` rule works on and yields: the parsed :class:`Script` with the facts rules ask about,
the :class:`Rule` itself, and the :class:`Finding` it produces.

The rules (:mod:`trainjob.tools.check_rules`) and the checker that runs them (:mod:`trainjob.tools.checker`) both
import these; neither imports the other's caller::

    script = Script("train.py", ast.parse(source), source)
    script.calls_to("set_epoch"), script.is_distributed
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

__all__ = ["Finding", "Rule", "Script", "Severity", "dotted_name"]

Severity = Literal["error", "warning", "hint"]

_RANK_TEST = re.compile(r"rank|is_main|main_process|is_master|master_process|global_zero|is_leader", re.I)


@dataclass(frozen=True)
class Finding:
    """One problem at ``path:line:col``, with what to do about it."""

    rule: str
    name: str
    severity: Severity
    path: str
    line: int
    col: int
    message: str
    fix: str

    def render(self) -> str:
        return f"{self.path}:{self.line}:{self.col}: {self.severity} {self.rule} {self.name}: {self.message}\n  fix: {self.fix}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Script:
    """A parsed script and the facts the rules ask about it."""

    path: str
    tree: ast.Module
    source: str
    parents: dict[ast.AST, ast.AST] = field(default_factory=dict)
    calls: list[tuple[str, ast.Call]] = field(default_factory=list)
    names: set[str] = field(default_factory=set)
    strings: set[str] = field(default_factory=set)
    #: Local names of imports and what they name: ``{"tt": "trainjob.torch", "seed": "helpers.seed_all"}``.
    imported_as: dict[str, str] = field(default_factory=dict)
    #: Functions of modules beside the script (``from helpers import setup``) with the calls they make,
    #: by the name the script imported them as; filled by :func:`trainjob.tools.checker.check_file`.
    helper_calls: dict[str, list[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    self.imported_as[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else alias.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom) and node.module is not None:
                for alias in node.names:
                    self.imported_as[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        for node in ast.walk(self.tree):
            for child in ast.iter_child_nodes(node):
                self.parents[child] = node
            if isinstance(node, ast.Call):
                self.calls.append((dotted_name(node.func), node))
        self.calls.sort(key=lambda item: (item[1].lineno, item[1].col_offset))
        self.names = {dotted_name(n) for n in ast.walk(self.tree) if isinstance(n, ast.Name | ast.Attribute)}
        self.strings = {
            n.value for n in ast.walk(self.tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
        }

    def calls_to(self, *tails: str) -> list[ast.Call]:
        """Calls whose function name ends in one of ``tails`` (``"set_epoch"`` matches ``sampler.set_epoch``)."""
        return [call for name, call in self.calls if name.rsplit(".", 1)[-1] in tails]

    def mentions(self, *words: str) -> bool:
        """Whether any name, attribute, import or string in the script contains one of ``words``."""
        imported = {
            alias.name
            for n in ast.walk(self.tree)
            if isinstance(n, ast.Import | ast.ImportFrom)
            for alias in n.names
        }
        modules = {n.module or "" for n in ast.walk(self.tree) if isinstance(n, ast.ImportFrom)}
        haystack = self.names | self.strings | imported | modules
        return any(word in text for text in haystack for word in words)

    @property
    def is_distributed(self) -> bool:
        """Whether the script starts or uses a process group (rules about ranks only apply then)."""
        return bool(
            self.calls_to("init_process_group", "DistributedDataParallel", "DDP", "FullyShardedDataParallel",
                          "FSDP", "fully_shard", "DistributedSampler", "prepare_model")
        ) or self.mentions("trainjob.torch", "LOCAL_RANK")  # fmt: skip

    def ancestors(self, node: ast.AST) -> Iterator[ast.AST]:
        while node in self.parents:
            node = self.parents[node]
            yield node

    def rank_guarded(self, node: ast.AST, _depth: int = 0) -> bool:
        """Whether ``node`` only runs on some ranks: under ``if rank == 0``-like tests, after an early return, or
        in a function that is only called from such places."""
        child = node
        for parent in self.ancestors(node):
            if isinstance(parent, ast.If | ast.IfExp) and _RANK_TEST.search(ast.unparse(parent.test)):
                return True
            if isinstance(parent, ast.FunctionDef | ast.AsyncFunctionDef):
                if any(_RANK_TEST.search(ast.unparse(d)) for d in parent.decorator_list):
                    return True
                if _returns_early_on_rank(parent.body, child):
                    return True
                callers = self.calls_to(parent.name)
                return bool(callers) and _depth < 3 and all(self.rank_guarded(c, _depth + 1) for c in callers)
            child = parent
        return False

    def hot_loop(self, node: ast.AST) -> ast.For | ast.While | None:
        """The innermost training loop (one that calls ``backward``) running ``node`` every iteration, if any."""
        for parent in self.ancestors(node):
            if isinstance(parent, ast.If):
                return None  # runs only on some iterations
            if isinstance(parent, ast.For | ast.While) and any(
                isinstance(n, ast.Call) and dotted_name(n.func).endswith("backward") for n in ast.walk(parent)
            ):
                return parent
            if isinstance(parent, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                return None
        return None


def _returns_early_on_rank(body: list[ast.stmt], upto: ast.AST) -> bool:
    for statement in body:
        if statement is upto:
            return False
        if (
            isinstance(statement, ast.If)
            and _RANK_TEST.search(ast.unparse(statement.test))
            and any(isinstance(s, ast.Return) for s in statement.body)
        ):
            return True
    return False


def dotted_name(node: ast.AST) -> str:
    """``torch.distributed.init_process_group`` for that expression; ``?`` for parts that are not names."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{dotted_name(node.value)}.{node.attr}"
    if isinstance(node, ast.Call):
        return dotted_name(node.func) + "()"
    return "?"


@dataclass(frozen=True)
class Rule:
    """A check with a stable id; ``find`` yields ``(node, message, fix)`` for each problem."""

    id: str
    name: str
    severity: Severity
    find: Callable[[Any], Iterator[tuple[Any, str, str]]]
    #: ``script``: ``find`` gets a :class:`Script` and yields AST nodes; ``manifest``: it gets a resolved
    #: :class:`~trainjob.runtime.plan.Plan` and yields the name of the variable or resource at fault.
    applies_to: Literal["script", "manifest"] = "script"
