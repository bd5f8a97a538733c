"""What a ``CustomTrainer`` may hold, checked when it is created or submitted, the same for every backend.

A trainer's function runs alone: its source, without decorators, goes into a generated script that imports only
:data:`SCRIPT_IMPORTS` and calls it on every rank. Whatever would fail there is refused at submit instead:

===============================  ==================================================================================
``func``                         a plain function defined with ``def`` whose source is available (not a lambda,
                                 an ``async def``, a builtin, or a function typed into a REPL)
its name                         not one of :data:`SCRIPT_IMPORTS` or :data:`RECORD_ERROR_FUNCTION`, which the
                                 script needs (``def json(): ...``)
its decorators                   removed, one line or many; the function runs undecorated
names it uses                    imported or defined inside it, built-ins, or :data:`SCRIPT_IMPORTS`; not
                                 variables of an enclosing function, module-level helpers or constants (also in
                                 default values and annotations, which the script evaluates)
``packages_to_install``          PEP 508 requirements only: ``torch``, ``transformers>=4.53,<5``,
                                 ``accelerate[deepspeed]``, ``pkg @ https://host/pkg.whl``,
                                 ``numpy; python_version >= "3.11"``; never pip options (``--index-url=...``,
                                 ``-r file``, ``--target dir``)
``pip_index_urls``               ``http://``, ``https://`` or ``file://`` URLs
===============================  ==================================================================================

::

    check_requirements(["transformers>=4.53"])           # ['transformers>=4.53']
    check_requirements(["-r /etc/passwd"])               # ValidationError: trainer.packages_to_install[0]: ...
    source = function_source(train)                      # FunctionSource(name='train', text='def train(...): ...')
"""

from __future__ import annotations

import builtins
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from trainjob.errors import ValidationError

#: The modules a generated training script imports before the function: the function may use them unimported.
SCRIPT_IMPORTS = ("atexit", "json", "os", "sys")
#: The function the generated script defines beside the user's, to record the exception the user's function raises.
RECORD_ERROR_FUNCTION = "_trainjob_record_error"

_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
_VERSION_ONE = r"(?:~=|===|==|!=|<=|>=|<|>)\s*[A-Za-z0-9_.*+!-]+"
_VERSIONS = rf"{_VERSION_ONE}(?:\s*,\s*{_VERSION_ONE})*"
_REQUIREMENT = re.compile(
    rf"(?P<name>{_NAME})\s*"
    rf"(?:\[\s*(?:{_NAME}(?:\s*,\s*{_NAME})*)?\s*\])?\s*"
    rf"(?:@\s*(?P<url>[A-Za-z][A-Za-z0-9+.-]*://\S+)(?:\s+;(?P<url_marker>.*))?"
    rf"|(?:\(\s*{_VERSIONS}\s*\)|{_VERSIONS})?\s*(?:;(?P<marker>.*))?)"
)
_MARKER_VARIABLES = {
    "python_version", "python_full_version", "os_name", "sys_platform", "platform_release", "platform_system",
    "platform_version", "platform_machine", "platform_python_implementation", "implementation_name",
    "implementation_version", "extra",
}
_MARKER_TOKEN = re.compile(r"\s*(?:(?P<string>'[^']*'|\"[^\"]*\")|(?P<op>===|==|!=|<=|>=|~=|<|>|\(|\))|(?P<word>[a-z_]+))")
_URL = re.compile(r"(?:https?://[^\s/]+|file://)\S*")
_REQUIREMENTS_HELP = (
    "must be a PEP 508 requirement such as 'transformers>=4.53' or 'pkg @ https://host/pkg.whl'; "
    "pip options are not accepted (index URLs go in pip_index_urls)"
)


def check_requirements(requirements: Sequence[str] | None, path: str = "trainer.packages_to_install") -> list[str]:
    """``requirements`` as PEP 508 strings (surrounding blanks removed); ``ValidationError`` naming each bad one."""
    if requirements is None:
        return []
    if isinstance(requirements, str) or not isinstance(requirements, Sequence):
        raise ValidationError(path, f"must be a list of PEP 508 requirements, got {requirements!r}")
    errors, checked = [], []
    for index, requirement in enumerate(requirements):
        if not isinstance(requirement, str) or not _is_requirement(requirement.strip()):
            errors.append(ValidationError(f"{path}[{index}]", f"{_REQUIREMENTS_HELP}, got {requirement!r}"))
        else:
            checked.append(requirement.strip())
    if errors:
        raise ValidationError.combine(errors)
    return checked


def check_index_urls(urls: Sequence[str] | None, path: str = "trainer.pip_index_urls") -> list[str]:
    """``urls`` if each is an ``http(s)://`` or ``file://`` URL; ``ValidationError`` naming each bad one."""
    if urls is None:
        return []
    if isinstance(urls, str) or not isinstance(urls, Sequence):
        raise ValidationError(path, f"must be a list of index URLs, got {urls!r}")
    errors = [
        ValidationError(f"{path}[{index}]", f"must be an http://, https:// or file:// URL, got {url!r}")
        for index, url in enumerate(urls)
        if not isinstance(url, str) or not _URL.fullmatch(url)
    ]
    if errors:
        raise ValidationError.combine(errors)
    return list(urls)


def _is_requirement(text: str) -> bool:
    match = _REQUIREMENT.fullmatch(text)
    if match is None or "\n" in text or "\0" in text:
        return False
    marker = match["marker"] if match["url"] is None else match["url_marker"]
    return marker is None or _is_marker(marker)


def _is_marker(text: str) -> bool:
    """Whether ``text`` is a PEP 508 environment marker: comparisons joined by and/or, in parentheses or not."""
    tokens: list[tuple[str, str]] = []
    position = 0
    while position < len(text.rstrip()):
        match = _MARKER_TOKEN.match(text, position)
        if match is None:
            return False
        kind = match.lastgroup or ""
        tokens.append((kind, match[kind]))
        position = match.end()
    tokens = _join_not_in(tokens)
    rest = _marker_or(tokens)
    return rest is not None and not rest


def _join_not_in(tokens: list[tuple[str, str]]) -> list[tuple[str, str]]:
    joined: list[tuple[str, str]] = []
    for token in tokens:
        if token == ("word", "in") and joined and joined[-1] == ("word", "not"):
            joined[-1] = ("op", "not in")
        elif token == ("word", "in"):
            joined.append(("op", "in"))
        else:
            joined.append(token)
    return joined


def _marker_or(tokens: list[tuple[str, str]]) -> list[tuple[str, str]] | None:
    rest = _marker_and(tokens)
    while rest and rest[0] == ("word", "or"):
        rest = _marker_and(rest[1:])
    return rest


def _marker_and(tokens: list[tuple[str, str]]) -> list[tuple[str, str]] | None:
    rest = _marker_expression(tokens)
    while rest and rest[0] == ("word", "and"):
        rest = _marker_expression(rest[1:])
    return rest


def _marker_expression(tokens: list[tuple[str, str]] | None) -> list[tuple[str, str]] | None:
    if not tokens:
        return None
    if tokens[0] == ("op", "("):
        rest = _marker_or(tokens[1:])
        return rest[1:] if rest and rest[0] == ("op", ")") else None
    if len(tokens) < 3 or tokens[1][0] != "op" or tokens[1][1] in "()":
        return None
    values = (tokens[0], tokens[2])
    if not all(kind == "string" or (kind == "word" and word in _MARKER_VARIABLES) for kind, word in values):
        return None
    return tokens[3:]


@dataclass(frozen=True)
class FunctionSource:
    """A training function as a generated script holds it: its ``def`` name and its undecorated source."""

    name: str
    text: str


def function_source(func: Callable[..., Any], path: str = "trainer.func") -> FunctionSource:
    """The source of ``func`` ready to run alone, or ``ValidationError`` saying why it would fail there."""
    import ast
    import inspect
    import textwrap

    func = inspect.unwrap(func)  # functools.wraps decorators: the function runs undecorated anyway
    if not inspect.isfunction(func) or func.__name__ == "<lambda>":
        raise ValidationError(path, f"must be a function defined with def, got {func!r}")
    if inspect.iscoroutinefunction(func) or inspect.isasyncgenfunction(func):
        raise ValidationError(path, f"must be a plain function (def), got async function {func.__name__}")
    try:
        source = textwrap.dedent(inspect.getsource(func))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError) as exc:
        raise ValidationError(path, f"its source is not available ({exc}); define {func.__name__} in a file") from None
    node = tree.body[0] if tree.body else None
    if not isinstance(node, ast.FunctionDef):
        raise ValidationError(path, f"its source is not a def statement of its own; define {func.__name__} in a file")
    if node.name in SCRIPT_IMPORTS or node.name == RECORD_ERROR_FUNCTION:
        raise ValidationError(
            path, f"is named {node.name!r}, which the job's script imports as a module or defines "
            f"({', '.join((*SCRIPT_IMPORTS, RECORD_ERROR_FUNCTION))}); rename the function",
        )
    if func.__code__.co_freevars:
        raise ValidationError(
            path, f"uses {', '.join(func.__code__.co_freevars)} of the function that defines {node.name}, which the "
            "job cannot see; pass them in func_args or define them inside the function",
        )
    lines = source.splitlines()[node.lineno - 1 : node.end_lineno]  # from the def line: decorators dropped
    text = "\n".join(lines)
    undefined = _undefined_names(text, node.name)
    if undefined:
        raise ValidationError(
            path, f"uses {', '.join(undefined)}, which {node.name} neither imports nor defines; the function runs "
            "alone in the job's script (which imports only " + ", ".join(SCRIPT_IMPORTS) + "), so import or "
            "define them inside it, or pass values in func_args",
        )
    return FunctionSource(name=node.name, text=text)


def _undefined_names(text: str, name: str) -> list[str]:
    """Global names the function's source reads (defaults and annotations included) that the script lacks."""
    import ast
    import symtable

    table = symtable.symtable(text, "train_function", "exec")
    reads = {s.get_name() for s in table.get_symbols() if s.is_referenced()}  # default values, annotations
    scopes = list(table.get_children())
    while scopes:
        scope = scopes.pop()
        reads |= {s.get_name() for s in scope.get_symbols() if s.is_global() and s.is_referenced() and not s.is_assigned()}
        scopes.extend(scope.get_children())
    known = set(dir(builtins)) | set(SCRIPT_IMPORTS) | {name, "__file__"}
    tree = ast.parse(text)
    return sorted(n for n in reads - known if not _read_only_in_local_annotations(tree, n))


def _read_only_in_local_annotations(tree: Any, name: str) -> bool:
    """Whether every read of ``name`` is a local variable's annotation (``x: Foo = 1``), which is never evaluated."""
    import ast

    reads = sum(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load) for n in ast.walk(tree))
    annotations = [n.annotation for n in ast.walk(tree) if isinstance(n, ast.AnnAssign)]
    annotated = sum(isinstance(n, ast.Name) and n.id == name for a in annotations for n in ast.walk(a))
    return reads > 0 and reads == annotated
