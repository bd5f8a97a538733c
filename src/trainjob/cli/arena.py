"""``trainjob submit pytorchjob``: arena's submit verb and flags, mapped onto ``trainjob run``.

Users of arena type ``arena submit pytorchjob --name mnist --workers 2 --gpus 1 --image IMG "python train.py"``;
the same line with ``trainjob`` creates a TrainJob:

=====================  ==========================================================================================
arena                  TrainJob
=====================  ==========================================================================================
``--name``             ``metadata.name``
``--workers N``        ``spec.trainer.numNodes`` (arena counts the master as a worker; so do we: N nodes in all)
``--gpus G``           ``nvidia.com/gpu: G`` per node and G processes per node (1 without GPUs;
                       ``--nproc-per-node`` overrides)
``--cpu``/``--memory``  per-node requests
``--image``            ``spec.trainer.image`` (not used by the local backend)
``--data PVC:PATH``    the claim mounted at PATH in every node (``podTemplateOverrides``; locally a directory
                       per claim, :mod:`trainjob.backends.local.volumes`; ``PVC:PATH:ro`` read-only)
``--env``/``--label``  ``spec.trainer.env`` / ``metadata.labels``
``--queue``            the ``kueue.x-k8s.io/queue-name`` label (``--priority-class``: ``kueue.x-k8s.io/priority-class``)
the command            ``python train.py ARGS`` runs under torchrun; ``python -m pkg ARGS`` as a module; any other
                       program with ``--no-python``
=====================  ==========================================================================================

The other arena verbs are trainjob's own: ``list``, ``get``, ``logs``, ``delete``, ``top job|node``.
"""

from __future__ import annotations

import re
import shlex

import click

from trainjob.cli.plumbing import Target, backend_option, handle_errors, make_backend
from trainjob.cli.volume_flags import data_overrides
from trainjob.errors import ValidationError

_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")


def parse_command(words: tuple[str, ...]) -> tuple[str, list[str], bool, bool]:
    """``(script, args, module, no_python)`` from arena's command (one quoted string, or words after ``--``)."""
    command = shlex.split(words[0]) if len(words) == 1 else list(words)
    if not command:
        raise ValidationError("COMMAND", "give the command to run, e.g. \"python train.py --epochs 2\"")
    if command[0] == "torchrun":
        raise ValidationError("COMMAND", "trainjob starts torchrun itself; give the script: python train.py ARGS")
    if _PYTHON.match(command[0].rsplit("/", 1)[-1]):
        rest = command[1:]
        if rest[:1] == ["-m"] and len(rest) > 1:
            return rest[1], rest[2:], True, False
        if not rest or rest[0].startswith("-"):
            raise ValidationError("COMMAND", f"cannot find the script in {shlex.join(command)!r}")
        return rest[0], rest[1:], False, False
    return command[0], command[1:], False, not command[0].endswith(".py")


def _pairs(values: tuple[str, ...], flag: str) -> dict[str, str]:
    out = {}
    for value in values:
        key, sep, val = value.partition("=")
        if not sep or not key:
            raise ValidationError(flag, f"must be KEY=VALUE, got {value!r}")
        out[key] = val
    return out


@click.group("submit")
def submit() -> None:
    """Submit a job the way arena does (arena submit pytorchjob ...)."""


@submit.command("pytorchjob", context_settings={"ignore_unknown_options": True})
@click.option("--name", required=True, help="Job name (metadata.name).")
@click.option("--workers", type=click.IntRange(min=1), default=1, show_default=True,
              help="Nodes in all, the master included (spec.trainer.numNodes).")
@click.option("--gpus", type=click.IntRange(min=0), default=0, show_default=True,
              help="GPUs per worker; that many processes per worker.")
@click.option("--nproc-per-node", help="Processes per worker (default: --gpus, else 1).")
@click.option("--cpu", help="CPUs per worker (a Kubernetes quantity: 2, 500m).")
@click.option("--memory", help="Memory per worker (a Kubernetes quantity: 4Gi).")
@click.option("--image", help="Container image on Kubernetes (the local backend runs this Python environment).")
@click.option("--data", multiple=True, metavar="PVC:PATH", help="Mount a PersistentVolumeClaim in every worker.")
@click.option("--env", multiple=True, metavar="KEY=VALUE", help="Environment variable; repeatable.")
@click.option("--label", multiple=True, metavar="KEY=VALUE", help="Label on the TrainJob; repeatable.")
@click.option("--runtime", default="torch-distributed", show_default=True, help="ClusterTrainingRuntime to use.")
@click.option("--queue", metavar="NAME",
              help="Kueue LocalQueue to wait in until admitted (label kueue.x-k8s.io/queue-name).")
@click.option("--priority-class", metavar="NAME",
              help="Kueue WorkloadPriorityClass of the job (label kueue.x-k8s.io/priority-class).")
@click.option("-f", "--follow", is_flag=True, help="Stream the logs until the job ends (arena returns at once).")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@backend_option
@handle_errors
def pytorchjob(name: str, workers: int, gpus: int, nproc_per_node: str | None, cpu: str | None, memory: str | None,
               image: str | None, data: tuple[str, ...], env: tuple[str, ...], label: tuple[str, ...], runtime: str,
               queue: str | None, priority_class: str | None, follow: bool, command: tuple[str, ...],
               backend: Target) -> None:
    """Submit a PyTorch job: COMMAND (\"python train.py ARGS\", or words after --) on every worker.

    trainjob submit pytorchjob --name mnist --workers 2 --gpus 1 --image pytorch:2.6 "python train.py --epochs 2"
    """
    from trainjob.api import TrainJob
    from trainjob.cli.jobs_run import queue_labels, run_trainjob, submit_and_follow

    script, args, module, no_python = parse_command(command)
    nproc = nproc_per_node or str(gpus or 1)
    resource = run_trainjob(script, tuple(args), name, runtime, workers, nproc, cpu, gpus or None, env,
                            module=module, no_python=no_python, image=image, memory=memory,
                            labels={**_pairs(label, "--label"), **queue_labels(queue, priority_class)} or None)
    overrides = data_overrides(data)
    if overrides:
        resource["spec"]["podTemplateOverrides"] = overrides
    job = TrainJob.from_dict(resource)
    if follow:
        submit_and_follow(job, backend, detach=False)
        return
    created = make_backend(backend).apply(job)
    click.echo(f"trainjob/{created.name} created ({created.num_nodes} node(s) x {created.num_proc_per_node} "
               f"process(es)); follow it with: trainjob logs {created.name} -f")


submit.add_command(pytorchjob, name="pytorch")


def register(group: click.Group) -> None:
    group.add_command(submit)
