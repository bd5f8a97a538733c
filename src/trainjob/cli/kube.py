"""``trainjob install`` and ``trainjob operator``: put the Kubernetes backend on a cluster and run its operator.

trainjob install --dry-run | kubectl apply --server-side -f -
trainjob install --context prod                 # applies it directly
trainjob install --write deploy/                # regenerates the kustomization in deploy/
trainjob install --kueue --cpu 16 --memory 64Gi --queue team -n ml-team --dry-run   # Kueue queues to start from
trainjob operator --kubeconfig ~/.kube/config   # runs the operator outside the cluster
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from trainjob.cli.plumbing import EXIT_BAD_INPUT, EXIT_FAILED, fail
from trainjob.errors import TrainJobError, ValidationError

_kubeconfig = click.option(
    "--kubeconfig", "config_file", type=click.Path(dir_okay=False), help="kubeconfig file."
)
_context = click.option("--context", help="kubeconfig context (default: the current one).")


@click.command("install")
@click.option("--dry-run", is_flag=True, help="Print the manifests instead of applying them.")
@click.option("--image", default=None, help="Operator image (default: the release image of this version).")
@click.option("--torch-image", default=None, metavar="IMAGE",
              help="The image of the built-in torch runtimes' nodes (torch-distributed, torch-distributed-volcano), "
                   "instead of pytorch/pytorch: e.g. your build of deploy/training.Dockerfile, which has trainjob "
                   "in it, or a mirror in a registry your nodes reach.")
@click.option("--initializer-image", default=None, metavar="IMAGE",
              help="The image that runs the dataset and model initializers where a runtime names Kubeflow's "
                   "(ghcr.io/kubeflow/trainer/*-initializer): one with trainjob[initializers] in it, such as your "
                   "build of deploy/training.Dockerfile (default: --torch-image; neither: Kubeflow's images run).")
@click.option("--initializer-env", "initializer_env", multiple=True, metavar="NAME=VALUE",
              help="An env var every dataset and model initializer gets unless it sets it (repeatable): a Hub "
                   "mirror (HF_ENDPOINT=http://hub-mirror), proxies. Kept in ConfigMap trainjob-initializer-env.")
@click.option(
    "--write",
    "write_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Write the kustomization (deploy/ layout) into this directory instead of applying.",
)
@click.option(
    "--operator-replicas",
    default=2,
    show_default=True,
    type=click.IntRange(0, 10),
    help="Operator replicas (they elect a leader); 0 installs everything but runs no operator in the cluster "
    "(run `trainjob operator` yourself).",
)
@click.option("--operator-cpu", default="100m", show_default=True, metavar="QUANTITY",
              help="Each operator replica's CPU request (0: none, e.g. on small nodes the training pods fill).")
@click.option("--operator-node-selector", "operator_node_selector", multiple=True, metavar="KEY=VALUE",
              help="A label of the nodes the operator runs on (repeatable): a pool of the cluster's own components, "
                   "away from the training pods' load.")
@click.option("--operator-toleration", "operator_tolerations", multiple=True, metavar="KEY[=VALUE]:EFFECT",
              help="A taint of those nodes the operator tolerates (repeatable), e.g. "
                   "node-role.kubernetes.io/control-plane:NoSchedule.")
@click.option("--operator-priority-class", default=None, metavar="NAME",
              help="The operator pods' PriorityClass, e.g. system-cluster-critical, so that training pods never "
                   "preempt or starve it.")
@click.option("--kueue", is_flag=True,
              help="Instead: a Kueue ResourceFlavor, ClusterQueue and LocalQueue to start from (Kueue must be "
                   "installed, with its trainer.kubeflow.org/trainjob integration enabled).")
@click.option("-n", "--namespace", default="default", show_default=True, help="With --kueue: the LocalQueue's namespace.")
@click.option("--queue", "local_queue", default="default", show_default=True,
              help="With --kueue: the LocalQueue's name (jobs say it in their kueue.x-k8s.io/queue-name label).")
@click.option("--cluster-queue", default="cluster-queue", show_default=True, help="With --kueue: the ClusterQueue.")
@click.option("--flavor", default="default-flavor", show_default=True, help="With --kueue: the ResourceFlavor.")
@click.option("--cpu", default="8", show_default=True, help="With --kueue: the CPU quota (0: none).")
@click.option("--memory", default="32Gi", show_default=True, help="With --kueue: the memory quota (0: none).")
@click.option("--gpu", default="0", show_default=True, help="With --kueue: the nvidia.com/gpu quota (0: none).")
@click.option("--node-label", "node_labels", multiple=True, metavar="KEY=VALUE",
              help="With --kueue: a label of the flavor's nodes; admitted pods select it (repeatable).")
@click.option("--toleration", "tolerations", multiple=True, metavar="KEY[=VALUE]:EFFECT",
              help="With --kueue: a taint of the flavor's nodes that admitted pods tolerate (repeatable).")
@click.option("--preempt-lower-priority", is_flag=True,
              help="With --kueue: a job of higher priority (kueue.x-k8s.io/priority-class) suspends running jobs "
                   "of lower priority in the ClusterQueue.")
@_kubeconfig
@_context
def install(
    dry_run: bool,
    image: str | None,
    torch_image: str | None,
    initializer_image: str | None,
    initializer_env: tuple[str, ...],
    write_dir: Path | None,
    operator_replicas: int,
    operator_cpu: str,
    operator_node_selector: tuple[str, ...],
    operator_tolerations: tuple[str, ...],
    operator_priority_class: str | None,
    kueue: bool,
    namespace: str,
    local_queue: str,
    cluster_queue: str,
    flavor: str,
    cpu: str,
    memory: str,
    gpu: str,
    node_labels: tuple[str, ...],
    tolerations: tuple[str, ...],
    preempt_lower_priority: bool,
    config_file: str | None,
    context: str | None,
) -> None:
    """Install the CRDs, RBAC, the operator Deployment and the built-in runtimes (JobSet must be installed);
    with --kueue, Kueue queues for TrainJobs instead."""
    from trainjob.backends.kubernetes import manifests

    image = image or manifests.DEFAULT_IMAGE
    if kueue:
        if write_dir is not None:
            fail("--kueue and --write: the queues are printed (--dry-run) or applied, not written as a "
                 "kustomization", EXIT_BAD_INPUT)
        objects = _kueue_objects(namespace, local_queue, cluster_queue, flavor, {"cpu": cpu, "memory": memory,
                                 "gpu": gpu}, node_labels, tolerations, preempt_lower_priority)
    elif write_dir is not None:
        for name, text in manifests.deploy_files(image, torch_image).items():
            target = write_dir / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            click.echo(f"wrote {target}")
        return
    else:
        objects = manifests.install_manifests(image, operator_replicas, torch_image,
                                              operator_cpu=_cpu_quantity(operator_cpu),
                                              initializer_image=initializer_image,
                                              initializer_env=_name_values(initializer_env, "--initializer-env"),
                                              placement=_placement(operator_node_selector, operator_tolerations,
                                                                   operator_priority_class))
    if dry_run:
        click.echo(manifests.manifests_yaml(objects), nl=False)
        return
    from trainjob.backends.kubernetes.config import KubernetesBackendConfig, load_api_client
    from trainjob.backends.kubernetes.install import apply_manifests

    try:
        client = load_api_client(KubernetesBackendConfig(config_file=config_file, context=context))
        for line in apply_manifests(client, objects):
            click.echo(line)
    except TrainJobError as exc:
        fail(str(exc), EXIT_FAILED)


def _placement(node_selector: tuple[str, ...], tolerations: tuple[str, ...], priority_class: str | None) -> Any:
    """``--operator-node-selector``, ``--operator-toleration`` and ``--operator-priority-class`` checked, as the
    operator's :class:`~trainjob.backends.kubernetes.manifests.OperatorPlacement`."""
    from trainjob.backends.kubernetes.kueue import parse_toleration
    from trainjob.backends.kubernetes.manifests import OperatorPlacement

    parsed = []
    for text in tolerations:
        try:
            parsed.append(parse_toleration(text))
        except ValidationError as exc:
            fail(f"--operator-toleration: {str(exc).split(': ', 1)[-1]}", EXIT_BAD_INPUT)
    if priority_class is not None and not priority_class.strip():
        fail("--operator-priority-class: must name a PriorityClass", EXIT_BAD_INPUT)
    return OperatorPlacement(node_selector=_name_values(node_selector, "--operator-node-selector"),
                             tolerations=parsed, priority_class=priority_class)


def _name_values(items: tuple[str, ...], flag: str) -> dict[str, str]:
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            fail(f"{flag}: expected NAME=VALUE, got {item!r}", EXIT_BAD_INPUT)
        out[name.strip()] = value
    return out


def _cpu_quantity(value: str) -> str:
    """``--operator-cpu`` as given, once it reads as a non-negative CPU quantity (``100m``, ``0.5``, ``1``)."""
    from trainjob.api.quantity import parse_quantity

    try:
        amount = parse_quantity(value)
    except ValueError as exc:
        fail(f"--operator-cpu: {exc}; a CPU quantity such as 100m, 0.5 or 0 is accepted", EXIT_BAD_INPUT)
    if amount < 0:
        fail(f"--operator-cpu: must not be negative, got {value!r}", EXIT_BAD_INPUT)
    return value


def _kueue_objects(namespace: str, local_queue: str, cluster_queue: str, flavor: str, quotas: dict[str, str],
                   node_labels: tuple[str, ...], tolerations: tuple[str, ...],
                   preempt_lower_priority: bool) -> list[dict[str, object]]:
    from trainjob.api.quantity import parse_quantity
    from trainjob.backends.kubernetes.kueue import (
        RESOURCES,
        QueueSetup,
        parse_node_label,
        parse_toleration,
        queue_manifests,
    )

    try:
        kept: dict[str, str] = {}
        for key, value in quotas.items():
            try:
                amount = parse_quantity(value)
            except ValueError as exc:
                raise ValidationError(f"--{key}", str(exc)) from None
            if amount < 0:
                raise ValidationError(f"--{key}", f"must not be negative, got {value!r}")
            if amount:
                kept[RESOURCES[key]] = value
        setup = QueueSetup(
            namespace=namespace, local_queue=local_queue, cluster_queue=cluster_queue, flavor=flavor, quotas=kept,
            node_labels=dict(parse_node_label(label) for label in node_labels),
            tolerations=[parse_toleration(t) for t in tolerations], preempt_lower_priority=preempt_lower_priority,
        )
        return queue_manifests(setup)
    except ValidationError as exc:
        fail(str(exc), EXIT_BAD_INPUT)


@click.command("operator")
@_kubeconfig
@_context
@click.option(
    "--namespace", "namespaces", multiple=True, help="Watch only this namespace (repeatable; default: all)."
)
@click.option(
    "--workers", default=4, show_default=True, type=click.IntRange(1, 64), help="Concurrent reconciles."
)
@click.option("--liveness", default=None, help="Serve health probes here, e.g. http://0.0.0.0:8080/healthz.")
@click.option(
    "--status-url",
    default=None,
    help="Serve Kubeflow's status endpoint; the URL the jobs' pods reach it at, e.g. "
    "https://trainjob-operator.trainjob-system.svc:8443 (without it, progress is read from node 0's log).",
)
@click.option("--status-port", default=8443, show_default=True, type=click.IntRange(0, 65535),
              help="Port of the status endpoint (with --status-url).")
@click.option("--leader-elect", is_flag=True,
              help="Reconcile only while holding the trainjob-operator Lease (run several replicas; one leads).")
@click.option("--lease-duration", default=15.0, show_default=True, type=click.FloatRange(min=1),
              help="Seconds followers wait, after the last renewal they saw, before taking over.")
@click.option("--renew-deadline", default=10.0, show_default=True, type=click.FloatRange(min=0.5),
              help="Seconds the leader keeps trying to renew before it gives up and exits.")
@click.option("--retry-period", default=2.0, show_default=True, type=click.FloatRange(min=0.1),
              help="Seconds between renewals (and between a follower's tries).")
@click.option("--metrics-port", default=None, type=click.IntRange(0, 65535),
              help="Serve Prometheus metrics on /metrics at this port.")
@click.option("-v", "--verbose", is_flag=True, help="Log every reconcile.")
def operator(config_file: str | None, context: str | None, verbose: bool, **options: Any) -> None:
    """Run the operator: reconcile TrainJobs into JobSets until interrupted."""
    import logging  # here, not at the top: every other command starts without it

    from trainjob.backends.kubernetes.config import KubernetesBackendConfig
    from trainjob.backends.kubernetes.rest import rest_config, without_kubernetes_client

    config = KubernetesBackendConfig(config_file=config_file, context=context)
    if rest_config(config) is not None:  # the operator's own client reads these credentials: no kubernetes client
        without_kubernetes_client()
    from trainjob.backends.kubernetes.operator import OperatorOptions, run_operator

    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        run_operator(OperatorOptions(config=config, **options))
    except ValueError as exc:  # settings the operator refuses (lease durations, the status URL)
        fail(str(exc), EXIT_FAILED)
    except TrainJobError as exc:
        fail(str(exc), EXIT_FAILED)


def register(group: click.Group) -> None:
    """Add ``install`` and ``operator`` to the ``trainjob`` group."""
    group.add_command(install)
    group.add_command(operator)
