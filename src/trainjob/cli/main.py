"""The ``trainjob`` command. Each command group lives in its own module; :data:`COMMANDS` says which.

Exit codes scripts can rely on: 0 success, 1 the job (or operation) failed, 2 bad input (usage, validation,
unknown names), 3 timeout while waiting, 130 interrupted. A trainjob error that a command did not turn into an
exit code itself still gets its code here, printed as ``error: ...`` lines, never as a traceback.

A command's module is imported only when that command runs (or ``--help`` lists them all), so ``trainjob list``
does not pay for the planner's tables, ``rich`` or the Kubernetes installer.
"""

from __future__ import annotations

import gc
import importlib
import sys
from typing import NoReturn

import click

from trainjob import __version__
from trainjob.cli.plumbing import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TIMEOUT,
    exit_code,
    note,
)
from trainjob.errors import TrainJobError

__all__ = [
    "COMMANDS", "EXIT_BAD_INPUT", "EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_TIMEOUT", "cli", "console", "main",
]

#: Every ``trainjob`` command: its name -> the module and attribute of its click command.
COMMANDS: dict[str, tuple[str, str]] = {
    "render": ("trainjob.cli.render", "render"),
    "convert": ("trainjob.cli.convert", "convert"),
    "list": ("trainjob.cli.jobs", "list_command"),
    "get": ("trainjob.cli.jobs", "get_command"),
    "describe": ("trainjob.cli.jobs", "describe_command"),
    "events": ("trainjob.cli.jobs", "events_command"),
    "delete": ("trainjob.cli.jobs", "delete_command"),
    "suspend": ("trainjob.cli.jobs", "suspend_command"),
    "resume": ("trainjob.cli.jobs", "resume_command"),
    "runtimes": ("trainjob.cli.jobs", "runtimes_command"),
    "run": ("trainjob.cli.jobs_run", "run_command"),
    "apply": ("trainjob.cli.jobs_run", "apply_command"),
    "logs": ("trainjob.cli.jobs_run", "logs_command"),
    "wait": ("trainjob.cli.jobs_run", "wait_command"),
    "stacks": ("trainjob.cli.stacks", "stacks_command"),
    "submit": ("trainjob.cli.arena", "submit"),
    "top": ("trainjob.cli.top", "top"),
    "install": ("trainjob.cli.kube", "install"),
    "operator": ("trainjob.cli.kube", "operator"),
    "plan": ("trainjob.cli.tools", "plan"),
    "check": ("trainjob.cli.tools", "check"),
    "bench": ("trainjob.cli.tools", "bench"),
    "ui": ("trainjob.cli.ui", "ui_command"),
    "gc": ("trainjob.cli.ui", "gc_command"),
    "cache": ("trainjob.cli.cache", "cache_command"),
}


class LazyGroup(click.Group):
    """A group whose commands (:data:`COMMANDS`) are imported when one is looked up, not when the CLI starts."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*COMMANDS, *self.commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            module, attribute = COMMANDS[cmd_name]
            self.add_command(getattr(importlib.import_module(module), attribute), cmd_name)
        return self.commands.get(cmd_name)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="trainjob")
def cli() -> None:
    """Run distributed PyTorch training jobs (Kubeflow Trainer API) locally or on Kubernetes."""


def main(argv: list[str] | None = None) -> int:
    try:
        return cli.main(args=argv, prog_name="trainjob", standalone_mode=True) or 0
    except SystemExit as exc:  # click exits through SystemExit
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    except TrainJobError as exc:  # raised outside a command's handle_errors: the same lines and code
        for line in str(exc).splitlines() or [type(exc).__name__]:
            note(f"error: {line}")
        return exit_code(exc)


def console() -> NoReturn:
    """The ``trainjob`` command as installed: :func:`main`, then exit. What the command built is left out of the
    interpreter's last garbage collection (``gc.freeze``): at exit its memory goes back as a whole anyway, so
    walking every object of the API models and the store would only delay the command's return."""
    code = main()
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    console()
