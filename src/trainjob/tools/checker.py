"""Find the classic distributed-training mistakes in a training script, without running it.

>>> findings = check_source('''
... import torch.distributed as dist
... from torch.utils.data import DataLoader, DistributedSampler
... dist.init_process_group("gloo")
... loader = DataLoader(data, sampler=DistributedSampler(data))
... ''', path="train.py")
>>> [(f.rule, f.line) for f in findings if f.severity == "error"]
[('TJ001', 5)]
>>> print(findings[0].render())
train.py:5:35: error TJ001 sampler-without-set-epoch: DistributedSampler is created but set_epoch() is never called
  fix: call sampler.set_epoch(epoch) at the start of every epoch, or every epoch repeats the first one's order

The rules live in :mod:`trainjob.tools.check_rules`. A finding on a line that carries ``# trainjob: ignore`` (all
rules) or ``# trainjob: ignore[TJ005,TJ010]`` is dropped.

A ``.yaml``, ``.yml`` or ``.json`` file is a manifest: each TrainJob in it (a kubeflow.org/v1 PyTorchJob is
converted first) is resolved against the runtimes in the file and the built-in ones, and the manifest rules
(TJ015-TJ017, NCCL set-up) look at the result; findings point at the line naming the variable or resource.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from trainjob.errors import ValidationError

__all__ = ["Finding", "Rule", "Script", "check_file", "check_source"]

Severity = Literal["error", "warning", "hint"]
SEVERITY_ORDER = {"error": 0, "warning": 1, "hint": 2}

_RANK_TEST = re.compile(r"rank|is_main|main_process|is_master|master_process|global_zero|is_leader", re.I)
_IGNORE = re.compile(r"#\s*trainjob:\s*ignore(?:\[(?P<rules>[A-Z0-9, ]+)\])?")


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
    #: by the name the script imported them as; filled by :func:`check_file`.
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


def _ignored(source_lines: list[str], finding: Finding) -> bool:
    line = source_lines[finding.line - 1] if 0 < finding.line <= len(source_lines) else ""
    match = _IGNORE.search(line)
    if match is None:
        return False
    rules = match["rules"]
    return rules is None or finding.rule in {r.strip() for r in rules.split(",")}


def check_source(
    source: str, path: str = "<string>", ignore: frozenset[str] = frozenset(), helper_dir: Path | None = None
) -> list[Finding]:
    """Findings for a script's text, errors first, then by line. A syntax error raises ``ValidationError``.
    ``helper_dir``: where the modules it imports helpers from live (:func:`check_file` passes the script's)."""
    from trainjob.tools.check_rules import RULES

    try:
        tree = ast.parse(source, filename=path)
    except SyntaxError as exc:
        raise ValidationError(path, f"line {exc.lineno}: cannot parse the script: {exc.msg}") from None
    script = Script(path, tree, source)
    if helper_dir is not None:
        script.helper_calls = helper_calls(tree, helper_dir)
    lines = source.splitlines()
    findings = [
        Finding(
            rule.id,
            rule.name,
            rule.severity,
            path,
            getattr(node, "lineno", 1),
            getattr(node, "col_offset", 0) + 1,
            message,
            fix,
        )  # fmt: skip
        for rule in RULES
        if rule.applies_to == "script" and rule.id not in ignore and rule.name not in ignore
        for node, message, fix in rule.find(script)
    ]
    kept = [f for f in findings if not _ignored(lines, f)]
    return sorted(kept, key=lambda f: (SEVERITY_ORDER[f.severity], f.line, f.col, f.rule))


def check_file(path: str | Path, ignore: frozenset[str] = frozenset()) -> list[Finding]:
    """Findings for a script on disk: ``check_file("train.py")``. A missing file raises ``ValidationError``.

    Functions the script imports from modules beside it (``from helpers import setup``) are looked into, so a
    seed set in such a helper counts."""
    if str(path).endswith(MANIFEST_SUFFIXES):
        return check_manifest(path, ignore)
    try:
        source = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValidationError(str(path), f"cannot read the script: {exc.strerror or exc}") from None
    return check_source(source, str(path), ignore, helper_dir=Path(path).parent)


MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")


def check_manifest(path: str | Path, ignore: frozenset[str] = frozenset()) -> list[Finding]:
    """Findings of the manifest rules for every TrainJob (or PyTorchJob) in a YAML file. An unreadable or invalid
    file, or a job whose runtime is unknown, raises ``ValidationError``."""
    import yaml

    from trainjob.api import TrainJob, read_documents, resource_from_dict
    from trainjob.api.io import is_pytorchjob
    from trainjob.runtime import find_runtime, resolve
    from trainjob.tools.check_rules import MANIFEST_RULES

    documents = read_documents(Path(path))
    text = Path(path).read_text(encoding="utf-8")
    starts = [node.start_mark.line for node in yaml.compose_all(text) if node is not None]
    lines = text.splitlines()
    located: list[tuple[Any, int]] = []
    for index, document in enumerate(documents):
        start = starts[index] if index < len(starts) else 0
        if is_pytorchjob(document):
            from trainjob.convert.pytorchjob import convert_pytorchjob

            located += [(r, start) for r in convert_pytorchjob(document).resources]
        else:
            located.append((resource_from_dict(document), start))
    runtimes = [r for r, _ in located if not isinstance(r, TrainJob)]
    findings: list[Finding] = []
    for job, start in located:
        if not isinstance(job, TrainJob):
            continue
        plan = resolve(job, find_runtime(job.spec.runtime_ref, runtimes, namespace=job.namespace))
        end = next((s for s in starts if s > start), len(lines))
        for rule in MANIFEST_RULES:
            if rule.id in ignore or rule.name in ignore:
                continue
            for subject, message, fix in rule.find(plan):
                line = next((i for i in range(start, end) if subject in lines[i]), start)
                col = lines[line].find(subject) + 1 if line < len(lines) and subject in lines[line] else 1
                findings.append(Finding(rule.id, rule.name, rule.severity, str(path), line + 1, col,
                                        f"TrainJob {job.name}: {message}", fix))
    return sorted(findings, key=lambda f: (SEVERITY_ORDER[f.severity], f.line, f.col, f.rule))


def helper_calls(tree: ast.Module, directory: Path) -> dict[str, list[str]]:
    """``{local name: [calls it makes]}`` for functions imported from modules in ``directory``."""
    found: dict[str, list[str]] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom) or not node.module or node.level > 1:
            continue
        module = directory / (node.module.replace(".", "/") + ".py")
        try:
            helper = ast.parse(module.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
            continue
        functions = {f.name: f for f in helper.body if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)}
        for alias in node.names:
            if alias.name in functions:
                body = functions[alias.name]
                found[alias.asname or alias.name] = [
                    dotted_name(n.func) for n in ast.walk(body) if isinstance(n, ast.Call)
                ]
    return found
