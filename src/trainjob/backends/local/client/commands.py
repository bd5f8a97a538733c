"""The file a local job's command runs, found before any process starts: a missing script fails the submit.

A pod that names a missing script fails when it starts; locally the same mistake is caught at submit
(``ValidationError`` on ``spec.trainer.command``, naming the file and the directory it was looked for in), so
nothing is created and no process starts. The script is the first positional argument after the launcher's own
options:

====================================  ==================================================================
``torchrun [opts] train.py ...``      ``train.py``; ``-m pkg.mod``: the module's top-level package is looked
                                      for; ``--no-python prog``: ``prog`` as a file or on ``PATH``
``python [opts] train.py ...``        ``train.py`` (``-c`` and ``-m`` run no file; ``-m torch.distributed.run``
                                      is torchrun)
``bash|sh [opts] run.sh ...``         ``run.sh`` (``-c`` runs no file)
``./run.sh ...``, ``/opt/bin/x ...``  the program itself (any first word with a ``/``)
====================================  ==================================================================

Anything else (a program on ``PATH``, an image's entrypoint) is left to the node. Relative paths are relative to
the job's working directory; files under ``provided`` (what the backend writes itself, such as the generated
function script) are not checked::

    check_command_files(["torchrun", "train.py", "--epochs", "3"], cwd="/home/me/project")
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from trainjob.errors import ValidationError

FIELD = "spec.trainer.command"
_TORCHRUN_FLAGS = {"-h", "--help", "--standalone", "-m", "--module", "--no-python", "--no_python", "--run-path",
                   "--run_path", "--virtual-local-rank", "--virtual_local_rank"}
_PYTHON_FLAGS = set("bBdEhiIOPqsSuvVx") | {"OO", "bb"}
_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")
_SHELLS = {"bash", "sh", "zsh", "dash"}
_MODULE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def check_command_files(command: list[str], cwd: str, provided: Path | None = None) -> None:
    """``ValidationError`` naming the script, module or program ``command`` runs when it does not exist."""
    if not command:
        return
    head = os.path.basename(command[0])
    if "/" in command[0]:
        _check_program(command[0], cwd, provided)
    if head == "torchrun":
        _check_torchrun(command[1:], cwd, provided)
    elif _PYTHON.match(head):
        _check_python(command[1:], cwd, provided)
    elif head in _SHELLS:
        _check_shell(command[1:], cwd, provided)


def _check_torchrun(args: list[str], cwd: str, provided: Path | None) -> None:
    module = no_python = False
    index = 0
    while index < len(args):
        arg = args[index]
        if arg == "--":
            index += 1
            break
        if not arg.startswith("-"):
            break
        if arg in ("-m", "--module"):
            module = True
        elif arg in ("--no-python", "--no_python"):
            no_python = True
        elif arg not in _TORCHRUN_FLAGS and "=" not in arg:
            index += 1  # the option's value
        index += 1
    if index >= len(args):
        raise ValidationError(FIELD, "torchrun is given no training script to run")
    target = args[index]
    if module:
        check_module(target, cwd)
    elif no_python:
        _check_program(target, cwd, provided, on_path=True)
    else:
        _check_file(target, cwd, provided)


def _check_python(args: list[str], cwd: str, provided: Path | None) -> None:
    index = 0
    while index < len(args):
        arg = args[index]
        if arg in ("-c", "-"):
            return
        if arg == "-m":
            if args[index + 1 : index + 2] == ["torch.distributed.run"]:
                _check_torchrun(args[index + 2 :], cwd, provided)
            elif index + 1 < len(args):
                check_module(args[index + 1], cwd)
            return
        if not arg.startswith("-"):
            _check_file(arg, cwd, provided)
            return
        if arg in ("-W", "-X"):
            index += 1
        elif arg.lstrip("-") not in _PYTHON_FLAGS and not arg.startswith(("-W", "-X", "--")):
            return  # an option this check does not know: leave it to Python
        index += 1


def _check_shell(args: list[str], cwd: str, provided: Path | None) -> None:
    for arg in args:
        if arg == "-c":
            return
        if not arg.startswith("-"):
            _check_file(arg, cwd, provided)
            return


def _resolve(path: str, cwd: str) -> Path:
    resolved = Path(cwd, os.path.expanduser(path))
    try:
        resolved.exists()
    except OSError as exc:  # a name the filesystem cannot even look up (too long, ...)
        raise ValidationError(FIELD, f"{_short(path)}: not a usable path ({exc.strerror})") from None
    return resolved


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _under(path: Path, provided: Path | None) -> bool:
    return provided is not None and str(path.resolve()).startswith(str(provided.resolve()) + os.sep)


def _check_file(path: str, cwd: str, provided: Path | None) -> None:
    resolved = _resolve(path, cwd)
    if _under(resolved, provided):
        return
    if not resolved.exists():
        raise ValidationError(FIELD, f"the script {path} does not exist (looked for {resolved})")
    if resolved.is_dir() and not (resolved / "__main__.py").is_file():
        raise ValidationError(FIELD, f"the script {path} is a directory without __main__.py ({resolved})")


def _check_program(program: str, cwd: str, provided: Path | None, on_path: bool = False) -> None:
    resolved = _resolve(program, cwd)
    if _under(resolved, provided):
        return
    if "/" not in program and on_path and not resolved.exists():
        if shutil.which(program) is None:
            raise ValidationError(FIELD, f"the program {program} is neither a file in {cwd} nor on PATH")
        return
    if not resolved.is_file():
        raise ValidationError(FIELD, f"the program {program} does not exist (looked for {resolved})")
    if not os.access(resolved, os.X_OK):
        raise ValidationError(FIELD, f"the program {program} is not executable; chmod +x {resolved}")


def check_module(module: str, cwd: str) -> None:
    """A module for ``python -m``: its top-level package must be in ``cwd`` or importable (nothing is imported)."""
    import importlib.util

    if not _MODULE.match(module):
        raise ValidationError(FIELD, f"{module!r} is not a Python module name (dotted identifiers, like pkg.train)")
    top = module.split(".")[0]
    base = Path(cwd)
    if (base / top).is_dir() or (base / f"{top}.py").is_file():
        return
    try:
        found = importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise ValidationError(FIELD, f"the module {module} cannot be found: no {top}/ or {top}.py in {cwd}, "
                                     f"and {top} is not installed")
