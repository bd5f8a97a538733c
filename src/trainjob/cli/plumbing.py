"""The plumbing every ``trainjob`` command shares: exit codes, errors, and the backend a command talks to.

Exit codes scripts can rely on (:data:`EXIT_OK` ...): 0 success, 1 the job or operation failed, 2 bad input
(usage, validation, unknown names), 3 timeout while waiting, 130 interrupted. Every error leaves through
:func:`fail` (one ``error: ...`` line per line of the message on stderr, then the exit code); a command wrapped in
:func:`handle_errors` gets trainjob's errors turned into the matching code (:func:`exit_code`), never a
traceback. Notes and warnings for the user go to stderr through :func:`note`.

Where a command's jobs live: the backend and, for Kubernetes, the namespace, kubeconfig and context. Every job
command takes ``--backend local|kubernetes`` and, as kubectl does, ``-n/--namespace``, ``--kubeconfig`` and
``--context`` (:func:`backend_option`). What is not given on the command line comes from, in order:

====================  ===========================================================================================
``--backend``         ``$TRAINJOB_BACKEND``, then ``backend:`` in the config file, then ``local``
``-n/--namespace``    ``namespace:`` in the config file, then the kubeconfig context's namespace, then ``default``
``--kubeconfig``      ``$KUBECONFIG``, then ``kubeconfig:`` in the config file, then ``~/.kube/config``
``--context``         ``context:`` in the config file, then the kubeconfig's current context
====================  ===========================================================================================

The config file is the first of ``$TRAINJOB_CONFIG``, ``$TRAINJOB_HOME/config.yaml`` and
``${XDG_CONFIG_HOME:-~/.config}/trainjob/config.yaml`` that exists::

    backend: kubernetes
    namespace: ml-team
    context: prod

(:mod:`trainjob.settings` tables every key the file may hold, the local queue's among them.)

Mistakes are usage errors (exit 2) that name the flag, variable or file to fix: an unknown backend, a key the
file does not know, Kubernetes flags with the local backend, or no kubeconfig to be found.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click

from trainjob.errors import AlreadyExistsError, JobFailedError, NotFoundError, TrainJobError, ValidationError
from trainjob.settings import config_paths, load_config

if TYPE_CHECKING:
    from trainjob.backends.base import Backend

#: Exit codes of every ``trainjob`` command (one table for the CLI).
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_TIMEOUT = 3
EXIT_INTERRUPTED = 130

BACKENDS = ("local", "kubernetes")
BACKEND_ENV = "TRAINJOB_BACKEND"
#: What messages call the file ``-`` (``-f -``: standard input).
STDIN = "<stdin>"

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Target:
    """The backend a command talks to; ``str(target)`` is the backend's name."""

    backend: str = "local"
    namespace: str | None = None
    kubeconfig: str | None = None
    context: str | None = None

    def __str__(self) -> str:
        return self.backend


def resolve_target(
    backend: str | None, namespace: str | None, kubeconfig: str | None, context: str | None
) -> Target:
    """The :class:`Target` for the flags given (``None``: not given), filled in from the environment and config."""
    config, path = load_config()
    if backend is None:
        backend = os.environ.get(BACKEND_ENV) or None
        if backend is not None and backend not in BACKENDS:
            raise ValidationError(BACKEND_ENV, f"must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend is None:
        backend = config.get("backend", "local")
        if backend not in BACKENDS:
            raise ValidationError(f"{path}: backend", f"must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend != "kubernetes":
        given = [flag for flag, value in (("--namespace", namespace), ("--kubeconfig", kubeconfig),
                                          ("--context", context)) if value is not None]
        if given:
            raise ValidationError(
                given[0], f"applies to the kubernetes backend only; add --backend kubernetes "
                f"(or set {BACKEND_ENV}=kubernetes, or backend: kubernetes in {path or config_paths()[-1]})"
            )
        return Target(backend)
    if kubeconfig is None and not os.environ.get("KUBECONFIG"):
        kubeconfig = config.get("kubeconfig")
    return Target(
        backend,
        namespace=namespace or config.get("namespace"),
        kubeconfig=str(Path(kubeconfig).expanduser()) if kubeconfig else None,
        context=context or config.get("context"),
    )


def check_kubeconfig(target: Target) -> None:
    """A usage error naming ``--kubeconfig`` when no kubeconfig can be read (and this is not inside a pod)."""
    if target.kubeconfig is not None:
        if not Path(target.kubeconfig).is_file():
            raise ValidationError("--kubeconfig", f"no such file: {target.kubeconfig}")
        return
    env = os.environ.get("KUBECONFIG")
    if env:
        files = [f for f in env.split(os.pathsep) if f]
        if not any(Path(f).expanduser().is_file() for f in files):
            raise ValidationError(
                "--kubeconfig", f"KUBECONFIG names no file that exists ({env}); pass --kubeconfig FILE or fix KUBECONFIG"
            )
        return
    if Path("~/.kube/config").expanduser().is_file() or "KUBERNETES_SERVICE_HOST" in os.environ:
        return
    raise ValidationError(
        "--kubeconfig",
        "no kubeconfig found (KUBECONFIG is not set and ~/.kube/config does not exist); pass --kubeconfig FILE, "
        "set KUBECONFIG, or put kubeconfig: FILE in the trainjob config file",
    )


def backend_option(command: F) -> F:
    """Add ``--backend``, ``-n/--namespace``, ``--kubeconfig`` and ``--context``; the command gets ``backend``,
    a :class:`Target` (which :func:`make_backend` turns into a backend)."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        backend = kwargs.pop("backend", None)
        namespace = kwargs.pop("namespace", None)
        kubeconfig = kwargs.pop("kubeconfig", None)
        context = kwargs.pop("context", None)
        try:
            kwargs["backend"] = resolve_target(backend, namespace, kubeconfig, context)
        except ValidationError as exc:
            fail(str(exc), EXIT_BAD_INPUT)
        return command(*args, **kwargs)

    options = [
        click.option("--backend", type=click.Choice(BACKENDS), default=None,
                     help=f"Where jobs run: processes on this machine, or a Kubernetes cluster "
                          f"[default: ${BACKEND_ENV}, the config file's backend:, else local]."),
        click.option("-n", "--namespace", default=None, help="Kubernetes namespace (kubernetes backend)."),
        click.option("--kubeconfig", default=None, metavar="FILE", help="kubeconfig file (kubernetes backend)."),
        click.option("--context", default=None, help="kubeconfig context (kubernetes backend)."),
    ]
    for option in reversed(options):
        wrapper = option(wrapper)
    return wrapper  # type: ignore[return-value]


def make_backend(target: Target | str) -> Backend:
    """A backend for ``target`` (a :class:`Target`, or a backend name); Kubernetes is imported only when asked."""
    if isinstance(target, str):
        target = Target(target)
    if target.backend == "kubernetes":
        from trainjob.backends.kubernetes.config import KubernetesBackendConfig
        from trainjob.sdk.client import backend_for

        check_kubeconfig(target)
        return backend_for(KubernetesBackendConfig(namespace=target.namespace, config_file=target.kubeconfig,
                                                   context=target.context))
    # What backend_for(None) gives, without importing the SDK's client for it.
    from trainjob.backends.local import local_backend

    return local_backend()


# -- errors and exit codes ----------------------------------------------------------------------------------------


def note(message: str) -> None:
    """A line for the user that is not the command's output (``note: ...``, ``warning: ...``): on stderr."""
    click.echo(message, err=True)


def exit_with(code: int) -> NoReturn:
    """End the command with ``code`` when what it printed already says why (``check`` found errors ...)."""
    raise SystemExit(code)


def fail(message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    """End the command: each line of ``message`` as ``error: LINE`` on stderr, then exit with ``code``."""
    for line in message.splitlines() or [""]:
        note(f"error: {line}")
    exit_with(code)


def exit_code(exc: BaseException) -> int:
    """The exit code an error ends a command with: bad input (invalid, unknown or taken names) 2, a failed job
    or operation 1, a timeout 3."""
    if isinstance(exc, ValidationError | NotFoundError | AlreadyExistsError):
        return EXIT_BAD_INPUT
    if isinstance(exc, TimeoutError):
        return EXIT_TIMEOUT
    return EXIT_FAILED


def handle_errors(command: F) -> F:
    """Turn trainjob errors (and timeouts) into :func:`fail` with their :func:`exit_code`; Ctrl-C exits 130."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except (ValidationError, NotFoundError, AlreadyExistsError) as exc:
            fail(str(exc).replace("\n", "; "), EXIT_BAD_INPUT)
        except (JobFailedError, TimeoutError, TrainJobError) as exc:
            fail(str(exc), exit_code(exc))
        except KeyboardInterrupt:
            exit_with(EXIT_INTERRUPTED)
        except Exception as exc:
            full = disk_full_message(exc)
            if full is None:
                raise
            fail(full, EXIT_FAILED)

    return wrapper  # type: ignore[return-value]


def disk_full_message(exc: BaseException) -> str | None:
    """What to tell the user when ``exc`` is a full disk under the local store (``ENOSPC``, or SQLite's "database
    or disk is full"), else ``None``. SQLite rolls back the transaction that did not fit, so the store stays
    consistent."""
    from trainjob.errors import is_disk_full

    if not is_disk_full(exc):
        return None
    where = getattr(exc, "filename", None) or os.environ.get("TRAINJOB_HOME") or "~/.trainjob"
    return (f"no space left on device: {where}; the change that did not fit was not made (the job store keeps "
            "each change whole): free some space (trainjob delete finished jobs, or set TRAINJOB_HOME to a larger "
            "disk) and try again")
