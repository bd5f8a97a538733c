"""The ``trainjob`` command. Each command group lives in its own module and registers itself here.

Exit codes scripts can rely on: 0 success, 1 the job (or operation) failed, 2 bad input (usage, validation,
unknown names), 3 timeout while waiting, 130 interrupted. A trainjob error that a command did not turn into an
exit code itself still gets its code here, printed as ``error: ...`` lines, never as a traceback.
"""

from __future__ import annotations

import sys

import click

from trainjob import __version__
from trainjob.cli import convert, jobs, kube, render, tools, ui
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

__all__ = ["EXIT_BAD_INPUT", "EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_TIMEOUT", "cli", "main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="trainjob")
def cli() -> None:
    """Run distributed PyTorch training jobs (Kubeflow Trainer API) locally or on Kubernetes."""


for module in (render, convert, jobs, kube, tools):
    module.register(cli)
cli.add_command(ui.ui_command)
cli.add_command(ui.gc_command)


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


if __name__ == "__main__":
    sys.exit(main())
