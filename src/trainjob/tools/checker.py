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
from pathlib import Path
from typing import Any

from trainjob.errors import ValidationError
from trainjob.tools.check_rules import MANIFEST_RULES, RULES
from trainjob.tools.script import Finding, Rule, Script, dotted_name

__all__ = ["Finding", "Rule", "Script", "check_file", "check_source"]

SEVERITY_ORDER = {"error": 0, "warning": 1, "hint": 2}

_IGNORE = re.compile(r"#\s*trainjob:\s*ignore(?:\[(?P<rules>[A-Z0-9, ]+)\])?")


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
