"""``run``, ``apply``, ``logs`` and ``wait``: the commands that create jobs or watch them.

``trainjob run train.py --nodes 2 --nproc-per-node 2 -- --epochs 3`` builds a TrainJob on the default runtime
(command ``torchrun train.py --epochs 3``), starts it and streams its logs; the exit code is the job's: 0 when
it completes, 1 when it fails. ``--detach`` prints the job's name and returns at once. As with torchrun,
``-m pkg.train`` runs a module and ``--no-python run.sh`` a shell script or binary.

``trainjob logs NAME`` prints every node's lines merged by the time they were written; ``--tail``, ``--since``,
``--previous`` and ``--timestamps`` work as in ``kubectl logs``.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from trainjob.backends.base import CheckedJob
from trainjob.cli.plumbing import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    Target,
    backend_option,
    exit_with,
    handle_errors,
    make_backend,
    note,
)
from trainjob.constants import (
    API_VERSION,
    OVERSUBSCRIBE_ANNOTATION,
    PRIORITY_ANNOTATION,
    STRICT_RESOURCES_ANNOTATION,
    TRAINJOB_KIND,
    TTL_ANNOTATION,
)
from trainjob.errors import AlreadyExistsError, NotFoundError, ValidationError
from trainjob.sdk import types


def default_job_name(script: str) -> str:
    """``digits_ddp.py`` -> ``digits-ddp-3f9a2``: the script's stem as a DNS label plus a random suffix."""
    stem = re.sub(r"[^a-z0-9-]+", "-", Path(script).stem.lower()).strip("-")
    if not stem or not stem[0].isalpha():
        stem = f"job-{stem}".rstrip("-")
    # os.urandom, not ``secrets``: importing ``secrets`` loads OpenSSL for ``hmac``, on the path of every ``run``.
    return f"{stem[:50].rstrip('-')}-{os.urandom(3).hex()[:5]}"


def parse_env(pairs: tuple[str, ...]) -> list[dict[str, str]]:
    env = []
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise ValidationError("--env", f"must be KEY=VALUE with KEY a variable name, got {pair!r}")
        env.append({"name": key, "value": value})
    return env


def launch_command(script: str, module: bool = False, no_python: bool = False) -> list[str]:
    """The torchrun command for ``trainjob run``'s SCRIPT: a Python file (made absolute), a module (``-m``), or a
    program that is not Python (``--no-python``: a file, made absolute, or a name on ``PATH``)."""
    import os
    import shutil

    if module and no_python:
        raise ValidationError("-m", "cannot be combined with --no-python (torchrun refuses both at once)")
    if module:
        from trainjob.backends.local import check_module

        try:
            check_module(script, os.getcwd())
        except ValidationError as exc:
            raise ValidationError("MODULE", exc.message) from None
        return ["torchrun", "-m", script]
    path = Path(script)
    if no_python:
        if path.is_file():
            if not os.access(path, os.X_OK):
                raise ValidationError("SCRIPT", f"{script} is not executable; chmod +x {script}")
            return ["torchrun", "--no-python", str(path.resolve())]
        if "/" not in script and shutil.which(script):
            return ["torchrun", "--no-python", script]
        raise ValidationError("SCRIPT", f"no such file or program on PATH: {script}")
    if not path.is_file():
        hint = " (a module? use -m; a shell script or binary? use --no-python)" if not script.endswith(".py") else ""
        raise ValidationError("SCRIPT", f"no such file: {script}{hint}")
    return ["torchrun", str(path.resolve())]


def in_image_command(script: str, module: bool = False, no_python: bool = False) -> list[str]:
    """The torchrun command for a SCRIPT the job's image holds, as given: a path in the image (relative to its
    working directory), a module (``-m``) or a program (``--no-python``)."""
    if module and no_python:
        raise ValidationError("-m", "cannot be combined with --no-python (torchrun refuses both at once)")
    return ["torchrun", *(["-m"] if module else ["--no-python"] if no_python else []), script]


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
    *,
    module: bool = False,
    no_python: bool = False,
    image: str | None = None,
    memory: str | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The TrainJob (Kubernetes shape) ``trainjob run`` (and ``trainjob submit pytorchjob``) submits."""
    # With an image, SCRIPT is the image's (relative to its WORKDIR, as seed 004's Dockerfile copies it): it is
    # neither looked for nor made absolute here.
    trainer: dict[str, Any] = {"command": in_image_command(script, module, no_python) if image
                               else launch_command(script, module, no_python)}
    if image:
        trainer["image"] = image
    if script_args:
        trainer["args"] = list(script_args)
    if nodes is not None:
        trainer["numNodes"] = nodes
    if nproc_per_node is not None:
        trainer["numProcPerNode"] = int(nproc_per_node) if nproc_per_node.isdigit() else nproc_per_node
    requests = {}
    if cpu is not None:
        requests["cpu"] = cpu
    if memory is not None:
        requests["memory"] = memory
    if gpu:
        requests["nvidia.com/gpu"] = str(gpu)
    if requests:
        trainer["resourcesPerNode"] = {"requests": requests}
    if env:
        trainer["env"] = parse_env(env)
    metadata: dict[str, Any] = {"name": name or default_job_name(script.rsplit(".", 1)[-1] if module else script)}
    if labels:
        metadata["labels"] = labels
    if annotations:
        metadata["annotations"] = annotations
    return {
        "apiVersion": API_VERSION,
        "kind": TRAINJOB_KIND,
        "metadata": metadata,
        "spec": {"runtimeRef": {"name": runtime}, "trainer": trainer},
    }


@click.command("run")
@click.argument("script", required=False)
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@click.option("-f", "--filename", "files", multiple=True, type=click.Path(dir_okay=False),
              help="Run the TrainJob (or Kubeflow v1 PyTorchJob) in this YAML instead of a SCRIPT, following its "
                   "logs; runtimes in the file are used first.")
@click.option("-m", "--module", is_flag=True, help="SCRIPT is a Python module to run (python -m), as torchrun -m.")
@click.option("--no-python", is_flag=True,
              help="SCRIPT is a shell script or binary to run as it is (torchrun --no-python).")
@click.option("--nodes", type=click.IntRange(min=1), help="Number of nodes (default: the runtime's).")
@click.option("--nproc-per-node", help="Processes per node: a number, auto, cpu or gpu.")
@click.option("--cpu", help="CPUs per node (a Kubernetes quantity: 2, 500m).")
@click.option("--gpu", type=click.IntRange(min=0), help="GPUs per node.")
@click.option("--env", multiple=True, metavar="KEY=VALUE", help="Environment variable for every process; repeatable.")
@click.option("--name", help="Job name (an RFC 1035 label); default: the script's name plus a random suffix.")
@click.option("--runtime", default="torch-distributed", show_default=True, help="ClusterTrainingRuntime to use.")
@click.option("--image", metavar="IMAGE",
              help="Run in this container image (spec.trainer.image); SCRIPT is then the image's, relative to its "
                   "WORKDIR. Locally each node is a container of it (Docker or Podman), as --containers.")
@click.option("--containers", is_flag=True,
              help="Local jobs: run each node as a container of the job's image (Docker or Podman) instead of a "
                   "process of this Python environment.")
@click.option("-d", "--detach", is_flag=True, help="Print the job name and return instead of streaming logs.")
@click.option("--inherit-env", is_flag=True,
              help="Local jobs: pass every process this shell's whole environment (default: what a pod would get, "
                   "plus PATH, HOME, locale and the Python environment).")
@click.option("--priority", type=int,
              help="Local queue: jobs with a higher priority start first when resources free up (default 0; "
                   "annotation trainjob/priority).")
@click.option("--oversubscribe", is_flag=True,
              help="Local queue: start now even if the job's requests do not fit what is free "
                   "(annotation trainjob/oversubscribe).")
@click.option("--strict-resources", is_flag=True,
              help="Local queue: refuse the job if it asks for more than this machine has, instead of running it "
                   "alone, scaled to the machine (annotation trainjob/strict-resources).")
@click.option("--ttl-seconds-after-finished", "ttl", type=click.IntRange(min=0), metavar="SECONDS",
              help="Delete the job and its logs this many seconds after it finishes "
                   "(annotation trainjob/ttl-seconds-after-finished).")
@click.option("--data", multiple=True, metavar="CLAIM:/PATH[:ro]",
              help="Mount a PersistentVolumeClaim at PATH on every node, as arena's --data; repeatable.")
@click.option("--config-map", "config_maps", multiple=True, metavar="NAME=PATH",
              help="Local jobs: the file or directory behind configMap NAME of the pod template; repeatable.")
@click.option("--nccl-profile", metavar="NAME[,NAME]",
              help="NCCL preset for every process: ib, roce, tcp, debug (annotation trainjob/nccl-profile).")
@click.option("--queue", metavar="NAME",
              help="Kueue LocalQueue to wait in until admitted (label kueue.x-k8s.io/queue-name).")
@click.option("--priority-class", metavar="NAME",
              help="Kueue WorkloadPriorityClass of the job (label kueue.x-k8s.io/priority-class).")
@backend_option
@handle_errors
def run_command(**flags: Any) -> None:
    """Run SCRIPT with torchrun on every node; arguments after -- go to the script.

    SCRIPT is a Python file, a module with -m (trainjob run -m pkg.train), or a shell script or binary with
    --no-python (trainjob run --no-python ./train.sh).
    """
    run_job(RunOptions(**flags))


@dataclass(frozen=True)
class RunOptions:
    """What ``trainjob run`` is asked: one field per argument and flag, named as :func:`run_command`'s options."""

    backend: Target
    script: str | None = None
    script_args: tuple[str, ...] = ()
    files: tuple[str, ...] = ()
    module: bool = False
    no_python: bool = False
    nodes: int | None = None
    nproc_per_node: str | None = None
    cpu: str | None = None
    gpu: int | None = None
    env: tuple[str, ...] = ()
    name: str | None = None
    runtime: str = "torch-distributed"
    image: str | None = None
    containers: bool = False
    detach: bool = False
    inherit_env: bool = False
    priority: int | None = None
    oversubscribe: bool = False
    strict_resources: bool = False
    ttl: int | None = None
    data: tuple[str, ...] = ()
    config_maps: tuple[str, ...] = ()
    nccl_profile: str | None = None
    queue: str | None = None
    priority_class: str | None = None


def run_job(options: RunOptions) -> None:
    """``trainjob run``: build the TrainJob from ``options`` (or read it from ``-f``), create it, then follow it
    to its end unless detached."""
    o = options
    if o.files:
        _run_files(o)
        return
    if o.script is None:
        raise ValidationError("SCRIPT", "missing: give a training script (trainjob run train.py) or a manifest "
                              "(trainjob run -f job.yaml)")
    from trainjob.cli.volume_flags import data_overrides

    job = run_trainjob(o.script, o.script_args, o.name, o.runtime, o.nodes, o.nproc_per_node, o.cpu, o.gpu, o.env,
                       module=o.module, no_python=o.no_python, image=o.image,
                       annotations=job_annotations(o.priority, o.oversubscribe, o.ttl, o.strict_resources),
                       labels=queue_labels(o.queue, o.priority_class))
    overrides = data_overrides(o.data)
    if overrides:
        job["spec"]["podTemplateOverrides"] = overrides
    # The flags are sound: the job's supervisor starts now, warm, so that its start overlaps the check of the
    # job against the API's models (their import is most of it) and its creation; it is stopped if no job comes of
    # it (a value the models refuse, a queued job).
    with warm_supervisor(o.backend, o.nodes or 1):
        from trainjob.api import TrainJob

        resource = TrainJob.from_dict(job)
        if o.nccl_profile:
            from trainjob.runtime.nccl import apply_nccl_profile

            resource = apply_nccl_profile(resource, o.nccl_profile)
        containers = o.containers or (o.image is not None and o.backend.backend == "local")
        created = submit(resource, o.backend, inherit_env=o.inherit_env, config_maps=o.config_maps,
                         containers=containers)
    follow_or_print(o.backend, created, o.detach)


def queue_labels(queue: str | None, priority_class: str | None) -> dict[str, str]:
    """The Kueue labels ``--queue`` and ``--priority-class`` stand for (each a DNS label, as Kueue's names are)."""
    labels: dict[str, str] = {}
    if queue is None and priority_class is None:
        return labels
    from trainjob.backends.kubernetes.kueue import PRIORITY_CLASS_LABEL, QUEUE_LABEL, check_name

    if queue is not None:
        labels[QUEUE_LABEL] = check_name("--queue", queue)
    if priority_class is not None:
        labels[PRIORITY_CLASS_LABEL] = check_name("--priority-class", priority_class)
    return labels


def job_annotations(priority: int | None, oversubscribe: bool, ttl: int | None,
                    strict_resources: bool = False) -> dict[str, str]:
    """The annotations ``--priority``, ``--oversubscribe``, ``--ttl-seconds-after-finished`` and
    ``--strict-resources`` stand for."""
    annotations: dict[str, str] = {}
    if priority is not None:
        annotations[PRIORITY_ANNOTATION] = str(priority)
    if oversubscribe:
        annotations[OVERSUBSCRIBE_ANNOTATION] = "true"
    if strict_resources:
        annotations[STRICT_RESOURCES_ANNOTATION] = "true"
    if ttl is not None:
        annotations[TTL_ANNOTATION] = str(ttl)
    return annotations


def apply_options(backend: Target, inherit_env: bool, config_maps: tuple[str, ...] = (),
                  containers: bool = False) -> dict[str, Any]:
    """Keyword arguments for ``apply`` from ``--inherit-env`` (local jobs only: a pod never gets this shell's),
    ``--config-map`` (local jobs only: on Kubernetes the configMap is a cluster object) and ``--containers``
    (local jobs only: a pod always runs its image)."""
    options: dict[str, Any] = {}
    if containers:
        if backend.backend != "local":
            raise ValidationError("--containers", "applies to local jobs only; on Kubernetes every pod runs its "
                                  "image (spec.trainer.image)")
        options["containers"] = True
    if inherit_env:
        if backend.backend != "local":
            raise ValidationError("--inherit-env", "applies to local jobs only; on Kubernetes set spec.trainer.env "
                                  "(trainjob run --env KEY=VALUE)")
        options["inherit_env"] = True
    if config_maps:
        from trainjob.cli.volume_flags import parse_config_maps

        if backend.backend != "local":
            raise ValidationError("--config-map", "applies to local jobs only; on Kubernetes create the ConfigMap "
                                  "(kubectl create configmap NAME --from-file=PATH)")
        options["config_maps"] = parse_config_maps(config_maps)
    return options


@contextlib.contextmanager
def warm_supervisor(backend: Target, nodes: int = 1) -> Iterator[None]:
    """For a local job: a warm supervisor from now, with warm keepers for ``nodes`` nodes, stopped when the block
    ends without a job created for it (:func:`trainjob.backends.local.warm_supervisor`)."""
    if backend.backend != "local":
        yield
        return
    from trainjob.backends.local import warm_supervisor as local_warm_supervisor

    with local_warm_supervisor(nodes):
        yield


def submit(resource: Any, backend: Target, inherit_env: bool = False, config_maps: tuple[str, ...] = (),
           containers: bool = False) -> Any:
    """Create the job (``apply``); the SDK's view of it."""
    options = apply_options(backend, inherit_env, config_maps, containers)  # a flag the backend cannot take, first
    created = make_backend(backend).apply(resource, **options)
    note_image_not_used(backend, [resource], containers)
    return created


def note_image_not_used(backend: Target, jobs: list[Any], containers: bool) -> None:
    """One line per created local job that names an image it does not run in, and what would run it there."""
    if backend.backend != "local" or containers:
        return
    from trainjob.backends.local import IMAGE_FLAGS

    for job in jobs:
        image = job.spec.trainer.image if job.spec.trainer is not None else None
        if image:
            note(f"trainjob/{job.name}: image {image} is not used here; its nodes run in this Python environment "
                 f"({IMAGE_FLAGS} run them in it)")


def follow_or_print(backend: Target, job: Any, detach: bool) -> None:
    """Print a created job's name (``detach``) or stream its logs until it ends, exiting with its outcome."""
    if detach:
        click.echo(job.name)
        return
    _follow_to_end(backend, job.name, f"{job.num_nodes} node(s) x {job.num_proc_per_node} process(es)")


def submit_and_follow(resource: Any, backend: Target, detach: bool, inherit_env: bool = False,
                      config_maps: tuple[str, ...] = ()) -> None:
    """Create the job; print its name (``detach``) or stream its logs until it ends, exiting with its outcome."""
    follow_or_print(backend, submit(resource, backend, inherit_env, config_maps), detach)


def _follow_to_end(backend: Target, name: str, shape: str | None = None) -> None:
    """Stream a created job's logs until it ends and exit with its outcome (Ctrl-C stops following only)."""
    from trainjob.cli.jobs_watch import follow

    created = f"trainjob/{name} created" + (f" ({shape})" if shape else "")
    note(f"{created}; Ctrl-C stops following, not the job")
    try:
        final = follow(lambda: make_backend(backend), name)
    except KeyboardInterrupt:
        note(f"stopped following; trainjob/{name} keeps running (`trainjob delete {name}` stops it)")
        exit_with(EXIT_INTERRUPTED)
    _report_final(final)


def _report_final(job: types.TrainJob) -> None:
    from datetime import UTC, datetime

    from trainjob.cli.jobs_format import human_duration, job_duration

    took = human_duration(job_duration(job, datetime.now(UTC)))
    if job.status == types.COMPLETE:
        note(f"trainjob/{job.name} Complete in {took}")
        return
    note(f"trainjob/{job.name} {job.status}: {job.reason}: {job.message}")
    exit_with(EXIT_FAILED)


@click.command("apply")
@click.option("-f", "--filename", "files", multiple=True, required=True, type=click.Path(dir_okay=False),
              help="YAML with TrainJobs and (Cluster)TrainingRuntimes; repeatable.")
@click.option("--dry-run", is_flag=True,
              help="Check and resolve everything, print what would be created, create nothing.")
@click.option("-o", "--output", type=click.Choice(["name", "yaml", "json"]),
              help="With --dry-run: the TrainJobs as they would be created (yaml/json), or trainjob/NAME lines.")
@click.option("--inherit-env", is_flag=True,
              help="Local jobs: pass every process this shell's whole environment (default: what a pod would get, "
                   "plus PATH, HOME, locale and the Python environment).")
@click.option("--config-map", "config_maps", multiple=True, metavar="NAME=PATH",
              help="Local jobs: the file or directory behind configMap NAME of the pod templates; repeatable.")
@click.option("--containers", is_flag=True,
              help="Local jobs: run each node as a container of the job's image (Docker or Podman) instead of a "
                   "process of this Python environment.")
@backend_option
@handle_errors
def apply_command(files: tuple[str, ...], dry_run: bool, output: str | None, inherit_env: bool,
                  config_maps: tuple[str, ...], containers: bool, backend: Target) -> None:
    """Create the TrainJobs in FILE(s); runtimes in the files are used before the built-in ones.

    Everything is checked first (fields, runtimes, names not taken, and locally the script each command runs), so
    either every job in the files is created or none is.
    """
    if output is not None and not dry_run:
        raise ValidationError("-o", "applies with --dry-run (apply prints trainjob/NAME created otherwise)")
    for name in create_from_files(files, dry_run, output, inherit_env, config_maps, backend, containers=containers):
        click.echo(f"trainjob/{name} created")


def _run_files(options: RunOptions) -> None:
    """``trainjob run -f job.yaml``: create the file's one TrainJob, then follow it as ``run SCRIPT`` does."""
    if options.script is not None:
        raise ValidationError("SCRIPT", f"give a script or -f FILE, not both (got {options.script!r} and -f)")
    if options.image is not None:
        raise ValidationError("--image", "applies to a SCRIPT; with -f the file's spec.trainer.image is the image "
                              "(--containers runs local nodes in it)")
    (name,) = create_from_files(options.files, False, None, options.inherit_env, options.config_maps,
                                options.backend, single=True, containers=options.containers)
    if options.detach:
        click.echo(name)
        return
    _follow_to_end(options.backend, name)


def create_from_files(files: tuple[str, ...], dry_run: bool, output: str | None, inherit_env: bool,
                      config_maps: tuple[str, ...], backend: Target, single: bool = False,
                      containers: bool = False) -> list[str]:
    """Check everything in ``files``, then create every TrainJob in them (or none); the names created.
    ``single``: the files must hold exactly one TrainJob (``run -f``)."""
    from trainjob.api import TrainJob
    from trainjob.cli.convert import report_converted_jobs
    from trainjob.convert import load_resources

    for file in files:
        if not Path(file).is_file():
            raise ValidationError("-f", f"no such file: {file}")
    resources = [resource for file in files for resource in load_resources(Path(file))]
    jobs = [r for r in resources if isinstance(r, TrainJob)]
    report_converted_jobs(jobs)
    runtimes = [r for r in resources if not isinstance(r, TrainJob)]
    if not jobs:
        raise ValidationError("-f", f"no TrainJob in {', '.join(files)}")
    if single and len(jobs) > 1:
        raise ValidationError("-f", f"{len(jobs)} TrainJobs in {', '.join(files)}: run follows one "
                              "(use trainjob apply -f for several)")
    options = apply_options(backend, inherit_env, config_maps, containers)
    check_options = {"containers": True} if containers else {}
    client = make_backend(backend)
    seen: set[str] = set()
    checked = []
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
        checked.append(client.check(job, runtimes, **check_options))
    if dry_run:
        _print_dry_run(checked, output)
        return []
    created: list[str] = []
    try:
        for job, check in zip(jobs, checked, strict=True):
            client.apply(job, runtimes, checked=check, **options)
            created.append(job.name)
    except BaseException:
        for name in created:  # all or none: a job the backend refuses takes the file's earlier ones with it
            with contextlib.suppress(NotFoundError):
                client.delete_job(name)
        raise
    note_image_not_used(backend, jobs, containers)
    return created


def _print_dry_run(checked: list[CheckedJob], output: str | None) -> None:
    import json

    documents = []
    for check in checked:
        job = check.trainjob
        resource = job.to_dict()
        resource.pop("status", None)
        documents.append(resource)
        if output is None:
            click.echo(f"trainjob/{job.name} created (dry run): {check.summary()}")
        elif output == "name":
            click.echo(f"trainjob/{job.name}")
    if output == "json":
        click.echo(json.dumps(documents[0] if len(documents) == 1 else {"apiVersion": "v1", "kind": "List",
                                                                         "items": documents}, indent=2))
    elif output == "yaml":
        from trainjob.api import dump_yaml

        click.echo(dump_yaml(documents), nl=False)


@click.command("logs")
@click.argument("name")
@click.option("--node", type=click.IntRange(min=0), help="Only this node's lines.")
@click.option("--rank", type=click.IntRange(min=0), help="Only this global rank's lines.")
@click.option("-f", "--follow", is_flag=True, help="Keep streaming new lines until the job ends.")
@click.option("--tail", type=click.IntRange(min=-1), default=-1, metavar="N",
              help="Only the last N lines (of all selected nodes together); -1: all.")
@click.option("--since", metavar="DURATION|TIME",
              help="Only lines written since then: a duration (30s, 5m, 2h, 1h30m) or an RFC 3339 time.")
@click.option("-p", "--previous", is_flag=True,
              help="The attempt before the last restart or resume (kubectl: the previous container).")
@click.option("--timestamps", is_flag=True, help="Start each line with the time it was written (RFC 3339).")
@click.option("--stop-output", is_flag=True,
              help="Also show what processes printed after a requested stop (suspend, delete, deadline).")
@backend_option
@handle_errors
def logs_command(name: str, node: int | None, rank: int | None, follow: bool, tail: int, since: str | None,
                 previous: bool, timestamps: bool, stop_output: bool, backend: Target) -> None:
    """Print a job's logs: every node's lines merged by time, each prefixed by node and rank."""
    from trainjob.cli.timespec import parse_since, rfc3339

    since_time = parse_since(since) if since is not None else None
    if previous and follow:
        raise ValidationError("--previous", "cannot be followed: the previous attempt is over (drop -f)")
    lines = make_backend(backend).logs(name, node=node, rank=rank, follow=follow, since=since_time,
                                       tail=None if tail < 0 else tail, previous=previous, stop_output=stop_output)
    printed = 0
    for line in lines:
        printed += 1
        click.echo(f"{rfc3339(line.time)} {line}" if timestamps else str(line))
    if not printed:
        wanted = [f"node-{node}" if node is not None else "", f"rank-{rank}" if rank is not None else ""]
        where = "/".join(w for w in wanted if w) or "any node"
        when = f" since {since}" if since else ""
        attempt = "the previous attempt of " if previous else ""
        note(f"no log lines from {where}{when} in {attempt}trainjob/{name}")


@click.command("wait")
@click.argument("name")
@click.option("--for", "wanted", type=click.Choice(types.STATUSES), multiple=True, default=(types.COMPLETE,),
              show_default=True, help="Status to wait for; repeatable (any of them ends the wait).")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=600, show_default=True,
              help="Seconds to wait; exit code 3 when they run out.")
@backend_option
@handle_errors
def wait_command(name: str, wanted: tuple[str, ...], timeout: float, backend: Target) -> None:
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
