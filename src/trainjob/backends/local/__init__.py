"""The local backend: a TrainJob as a tree of processes on this machine, one folder per process.

::

    CLI / SDK process                     client/        LocalBackend: submit, admit from the queue, read, stop
    └── supervisor, one per job           supervisor/    python -m trainjob.backends.local.supervisor HOME NAME
        │                                                (``trainjob run``'s: ... --warm, started before the
        │                                                job is read and handed the job when it is created)
        ├── rendezvous store (shrinkable              python -m trainjob.backends.local.supervisor.rendezvous
        │   elastic jobs only)                              JOB_DIR PORT
        └── node keeper, one per node     node_keeper/   python -m trainjob.backends.local.node_keeper (spec on stdin)
            └── the node's command: the pod's command, usually torchrun
                │   shrinkable elastic jobs: torchrun/   python -m trainjob.backends.local.torchrun.elastic_agent
                │   MPI jobs:                mpi/        python -m trainjob.backends.local.mpi node | launcher ...
                │                                        (mpirun's ssh: python -m trainjob.backends.local.mpi.rsh)
                └── ranks                 worker_site/   on every node process's PYTHONPATH: its sitecustomize
                                                         records a rank's exception for the job's status and
                                                         dumps the rank's stacks when signalled

Modules at this level are shared by several of these processes:

=======================  ===========================================================================================
:mod:`.store`            the jobs' state in SQLite, read and written by the CLI, the SDK and every supervisor
:mod:`.processes`        finding and stopping a job's processes; the supervisor lock
:mod:`.process_specs`    how each node becomes a process (command, environment, CPUs, GPUs, ports): worked out
                         at submit, stored with the job, carried out by the supervisor
:mod:`.node_env`         what a node process gets of the environment the job is created from (light enough for
                         the warm processes, started before their job)
:mod:`.volumes`          the pod template's volumes as host paths: worked out at submit, mounted by the keepers
:mod:`.log_writer`       node logs as the keepers write them
:mod:`.log_reader`       node logs as the CLI, the SDK, the UI and the supervisor's failure report read them
:mod:`.stacks`           every running rank's Python stacks, read by ``trainjob stacks`` and by the supervisor's
                         stall watch (:mod:`.supervisor.stall_watch`)
=======================  ===========================================================================================

The CLI and the dashboard reach the local backend through this package only: :func:`local_backend`,
:func:`warm_supervisor` and :func:`check_module`, each importing what it needs when called, so that
``python -m`` of any process above imports nothing more than its own modules.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainjob.backends.local.client.backend import LocalBackend


#: What runs a job's nodes in its image (:mod:`~trainjob.backends.local.containers`), as ``trainjob run`` and the
#: ``ImageNotUsed`` event name it.
IMAGE_FLAGS = "trainjob run --image, trainjob apply --containers or TrainerClient(ContainerBackendConfig())"


def local_backend(home: str | Path | None = None) -> LocalBackend:
    """The local backend of ``home`` (default ``$TRAINJOB_HOME``, :func:`trainjob.settings.default_home`)."""
    from trainjob.backends.local.client.backend import LocalBackend, LocalProcessBackendConfig

    return LocalBackend(LocalProcessBackendConfig(home=home))


@contextlib.contextmanager
def warm_supervisor(nodes: int = 1) -> Iterator[None]:
    """A warm supervisor from now, with warm keepers for ``nodes`` nodes, for the job this process is about to
    create; stopped when the block ends without a job created for it (bad input, a queued job, a failed
    creation) (:mod:`~trainjob.backends.local.supervisor.warm`)."""
    from trainjob.backends.local.supervisor import warm

    warm.start(nodes)
    try:
        yield
    finally:
        warm.release()


def check_module(module: str, cwd: str) -> None:
    """A module for ``python -m``: its top-level package must be in ``cwd`` or importable
    (:func:`~trainjob.backends.local.client.commands.check_module`); ``ValidationError`` otherwise."""
    from trainjob.backends.local.client.commands import check_module as check

    check(module, cwd)
