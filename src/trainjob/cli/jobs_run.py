"""``run``, ``apply``, ``logs`` and ``wait``: the commands that create jobs or watch them.

``trainjob run train.py --nodes 2 --nproc-per-node 2 -- --epochs 3`` builds a TrainJob on the default runtime
(command ``torchrun train.py --epochs 3``), starts it and streams its logs; the exit code is the job's: 0 when
it completes, 1 when it fails. ``--detach`` prints the job's name and returns at once.
"""

from __future__ import annotations

import contextlib
import re
import sys
from pathlib import Path
from typing import Any

import click

from trainjob import types
from trainjob.cli.jobs import EXIT_FAILED, EXIT_INTERRUPTED, backend_option, handle_errors, make_backend
from trainjob.errors import AlreadyExistsError, NotFoundError, ValidationError

API_VERSION = "trainer.kubeflow.org/v1alpha1"


def default_job_name(script: str) -> str:
    """``digits_ddp.py`` -> ``digits-ddp-x7k2p``: the script's stem as a DNS label plus a random suffix."""
    import secrets  # only ``run`` pays for it (it pulls in hashlib and random)

    stem = re.sub(r"[^a-z0-9-]+", "-", Path(script).stem.lower()).strip("-")
    if not stem or not stem[0].isalpha():
        stem = f"job-{stem}".rstrip("-")
    return f"{stem[:50].rstrip('-')}-{secrets.token_hex(3)[:5]}"


def parse_env(pairs: tuple[str, ...]) -> list[dict[str, str]]:
    env = []
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise ValidationError("--env", f"must be KEY=VALUE with KEY a variable name, got {pair!r}")
        env.append({"name": key, "value": value})
    return env


def run_trainjob(
    script: str,
    script_args: tuple[str, ...],
    name: str | None,
    runtime: str,
    nodes: int | None,
    nproc_per_node: str | None,
    cpu: str | None,
    gpu: int | None,
    env: tuple[str, ...],
) -> dict[str, Any]:
    """The TrainJob (Kubernetes shape) ``trainjob run`` submits."""
    path = Path(script)
    if not path.is_file():
        raise ValidationError("SCRIPT", f"no such file: {script}")
    trainer: dict[str, Any] = {"command": ["torchrun", str(path.resolve())]}
    if script_args:
        trainer["args"] = list(script_args)
    if nodes is not None:
        trainer["numNodes"] = nodes
    if nproc_per_node is not None:
        trainer["numProcPerNode"] = int(nproc_per_node) if nproc_per_node.isdigit() else nproc_per_node
    requests = {}
    if cpu is not None:
        requests["cpu"] = cpu
    if gpu:
        requests["nvidia.com/gpu"] = str(gpu)
    if requests:
        trainer["resourcesPerNode"] = {"requests": requests}
    if env:
        trainer["env"] = parse_env(env)
    return {
        "apiVersion": API_VERSION,
        "kind": "TrainJob",
        "metadata": {"name": name or default_job_name(script)},
        "spec": {"runtimeRef": {"name": runtime}, "trainer": trainer},
    }


@click.command("run")
@click.argument("script")
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@click.option("--nodes", type=click.IntRange(min=1), help="Number of nodes (default: the runtime's).")
@click.option("--nproc-per-node", help="Processes per node: a number, auto, cpu or gpu.")
@click.option("--cpu", help="CPUs per node (a Kubernetes quantity: 2, 500m).")
@click.option("--gpu", type=click.IntRange(min=0), help="GPUs per node.")
@click.option("--env", multiple=True, metavar="KEY=VALUE", help="Environment variable for every process; repeatable.")
@click.option("--name", help="Job name (an RFC 1035 label); default: the script's name plus a random suffix.")
@click.option("--runtime", default="torch-distributed", show_default=True, help="ClusterTrainingRuntime to use.")
@click.option("-d", "--detach", is_flag=True, help="Print the job name and return instead of streaming logs.")
@backend_option
@handle_errors
def run_command(script: str, script_args: tuple[str, ...], nodes: int | None, nproc_per_node: str | None,
                cpu: str | None, gpu: int | None, env: tuple[str, ...], name: str | None, runtime: str,
                detach: bool, backend: str) -> None:
    """Run SCRIPT with torchrun on every node; arguments after -- go to the script."""
    from trainjob.api import TrainJob
    from trainjob.cli.jobs_watch import follow

    resource = TrainJob.from_dict(run_trainjob(script, script_args, name, runtime, nodes, nproc_per_node, cpu, gpu, env))
    client = make_backend(backend)
    job = client.apply(resource)
    if detach:
        click.echo(job.name)
        return
    click.echo(f"trainjob/{job.name} created ({job.num_nodes} node(s) x {job.num_proc_per_node} process(es)); "
               "Ctrl-C stops following, not the job", err=True)
    try:
        final = follow(lambda: make_backend(backend), job.name)
    except KeyboardInterrupt:
        click.echo(f"stopped following; trainjob/{job.name} keeps running (`trainjob delete {job.name}` stops it)",
                   err=True)
        sys.exit(EXIT_INTERRUPTED)
    _report_final(final)


def _report_final(job: types.TrainJob) -> None:
    from datetime import UTC, datetime

    from trainjob.cli.jobs_format import human_duration, job_duration

    took = human_duration(job_duration(job, datetime.now(UTC)))
    if job.status == types.COMPLETE:
        click.echo(f"trainjob/{job.name} Complete in {took}", err=True)
        return
    click.echo(f"trainjob/{job.name} {job.status}: {job.reason}: {job.message}", err=True)
    sys.exit(EXIT_FAILED)


@click.command("apply")
@click.option("-f", "--filename", "files", multiple=True, required=True, type=click.Path(dir_okay=False),
              help="YAML with TrainJobs and (Cluster)TrainingRuntimes; repeatable.")
@backend_option
@handle_errors
def apply_command(files: tuple[str, ...], backend: str) -> None:
    """Create the TrainJobs in FILE(s); runtimes in the files are used before the built-in ones."""
    from trainjob.api import TrainJob, load_resources
    from trainjob.runtime import find_runtime, resolve

    for file in files:
        if not Path(file).is_file():
            raise ValidationError("-f", f"no such file: {file}")
    resources = [resource for file in files for resource in load_resources(Path(file))]
    jobs = [r for r in resources if isinstance(r, TrainJob)]
    runtimes = [r for r in resources if not isinstance(r, TrainJob)]
    if not jobs:
        raise ValidationError("-f", f"no TrainJob in {', '.join(files)}")
    client = make_backend(backend)
    seen: set[str] = set()
    for job in jobs:  # check everything before creating anything
        if job.name in seen:
            raise ValidationError("metadata.name", f"TrainJob {job.name!r} appears twice in the files")
        seen.add(job.name)
        try:
            client.get_job(job.name)
        except NotFoundError:
            pass
        else:
            raise AlreadyExistsError(f"TrainJob {job.name!r} already exists; delete it first or choose another name")
        resolve(job, find_runtime(job.spec.runtime_ref, runtimes, namespace=job.namespace))
    created: list[str] = []
    try:
        for job in jobs:
            client.apply(job, runtimes)
            created.append(job.name)
    except BaseException:
        for name in created:  # all or none: a job the backend refuses takes the file's earlier ones with it
            with contextlib.suppress(NotFoundError):
                client.delete_job(name)
        raise
    for name in created:
        click.echo(f"trainjob/{name} created")


@click.command("logs")
@click.argument("name")
@click.option("--node", type=click.IntRange(min=0), help="Only this node's lines.")
@click.option("--rank", type=click.IntRange(min=0), help="Only this global rank's lines.")
@click.option("-f", "--follow", is_flag=True, help="Keep streaming new lines until the job ends.")
@backend_option
@handle_errors
def logs_command(name: str, node: int | None, rank: int | None, follow: bool, backend: str) -> None:
    """Print a job's logs, each line prefixed by node and rank."""
    for line in make_backend(backend).logs(name, node=node, rank=rank, follow=follow):
        click.echo(str(line))


@click.command("wait")
@click.argument("name")
@click.option("--for", "wanted", type=click.Choice(types.STATUSES), multiple=True, default=(types.COMPLETE,),
              show_default=True, help="Status to wait for; repeatable (any of them ends the wait).")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=600, show_default=True,
              help="Seconds to wait; exit code 3 when they run out.")
@backend_option
@handle_errors
def wait_command(name: str, wanted: tuple[str, ...], timeout: float, backend: str) -> None:
    """Wait for a job to reach a status, showing its progress; exit code 1 if it fails instead."""
    from trainjob.cli.jobs_watch import live_display, status_line

    client = make_backend(backend)
    live = live_display()
    if live:
        live.start()
    try:
        callbacks = [lambda job: live.update(status_line(job))] if live else None
        job = client.wait_for_job_status(name, set(wanted), timeout=timeout, polling_interval=0.5, callbacks=callbacks)
    finally:
        if live:
            live.stop()
    click.echo(f"trainjob/{job.name} {job.status}")


def register(group: click.Group) -> None:
    for command in (run_command, apply_command, logs_command, wait_command):
        group.add_command(command)
