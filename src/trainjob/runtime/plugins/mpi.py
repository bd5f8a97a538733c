"""The mpi plugin: a ``launcher`` that runs ``mpirun`` over ``node`` pods, for runtimes with ``mlPolicy.mpi``.

Kubeflow Trainer v2.1's MPI semantics:

=====================================  ==================================================================
what                                   value
=====================================  ==================================================================
``launcher`` replicated job            one pod; the TrainJob's image, command, args, env and resources
                                       go to its ``node`` container (the ``trainer`` ancestor)
``node`` replicated job                ``spec.trainer.numNodes`` pods (``runLauncherAsNode``: one fewer,
                                       at least 1); with ``runLauncherAsNode`` the TrainJob's env and
                                       ``resourcesPerNode`` reach them too
hosts (hostfile lines)                 ``runLauncherAsNode``: ``{job}-launcher-0-0.{job}`` first; then
                                       ``{job}-node-0-{i}.{job} slots={numProcPerNode}`` per node pod
slots (``numProcPerNode``)             ``spec.trainer.numProcPerNode`` (an integer), else the runtime's
                                       (default 1); a runtime's 1 becomes the GPU count when a node
                                       requests more than one GPU
Secret ``{job}-mpi-ssh-auth``          ``kubernetes.io/ssh-auth``, immutable, a generated key pair
                                       (``ssh-privatekey``, ``ssh-publickey``), mounted on both jobs'
                                       ``node`` containers at ``sshAuthMountPath`` (default
                                       ``/root/.ssh``) as ``id_rsa``, ``id_rsa.pub``, ``authorized_keys``
ConfigMap ``{job}-mpi-hostfile``       key ``hostfile``, mounted on the launcher at ``/etc/mpi``
launcher env (OpenMPI)                 ``OMPI_MCA_orte_default_hostfile=/etc/mpi/hostfile``,
                                       ``OMPI_MCA_orte_keep_fqdn_hostnames=true``,
                                       ``OMPI_MCA_orte_set_default_slots={slots}``,
                                       ``OMPI_MCA_plm_rsh_args=-o ConnectionAttempts=10``
=====================================  ==================================================================

Only ``OpenMPI`` (also spelt ``""``) is supported, as in Kubeflow v2.1. This plugin renders the Secret and the
ConfigMap (labelled ``trainer.kubeflow.org/trainjob-name``), which go beside the JobSet; the key pair is generated
when the Secret is rendered, so an operator creates the Secret once and keeps it (it is immutable).
"""

from __future__ import annotations

import base64
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from trainjob.api import MPIMLPolicy
from trainjob.api.errors import quote
from trainjob.api.quantity import gpu_count
from trainjob.constants import TRAINER_CONTAINER, TRAINER_JOB, TRAINJOB_NAME_LABEL
from trainjob.errors import ValidationError
from trainjob.runtime.plan import Container, EnvVar, MPIPolicy, Plan, PodSet, Resources
from trainjob.runtime.plugin import Context, MLPolicyEnforcer, Plugin, Renderer, Validator
from trainjob.runtime.template import env_from_api, pod_spec, upsert_env
from trainjob.runtime.trainer_spec import requested_num_nodes

LAUNCHER = "launcher"
NODE = TRAINER_JOB
SUPPORTED_IMPLEMENTATIONS = ("OpenMPI",)
DEFAULT_SSH_AUTH_MOUNT_PATH = "/root/.ssh"
SSH_AUTH_SECRET_SUFFIX = "-mpi-ssh-auth"
SSH_AUTH_VOLUME = "mpi-ssh-auth"
SSH_PRIVATE_KEY = "ssh-privatekey"
SSH_PUBLIC_KEY = "ssh-publickey"
HOSTFILE_CONFIGMAP_SUFFIX = "-mpi-hostfile"
HOSTFILE_VOLUME = "mpi-hostfile"
HOSTFILE_DIR = "/etc/mpi"
HOSTFILE_NAME = "hostfile"
HOSTFILE_ENV = "OMPI_MCA_orte_default_hostfile"
RSH_ARGS = "-o ConnectionAttempts=10"


def openmpi_env(policy: MPIPolicy, hostfile: str = f"{HOSTFILE_DIR}/{HOSTFILE_NAME}") -> list[EnvVar]:
    """The launcher's ``OMPI_MCA_*`` variables (see the module docstring); ``hostfile`` is where the hostfile is
    (the ConfigMap's mount; the local backend writes it into the job's directory)."""
    return [
        EnvVar(HOSTFILE_ENV, hostfile),
        EnvVar("OMPI_MCA_orte_keep_fqdn_hostnames", "true"),
        EnvVar("OMPI_MCA_orte_set_default_slots", str(policy.slots)),
        EnvVar("OMPI_MCA_plm_rsh_args", RSH_ARGS),
    ]


def ssh_auth_secret_name(job_name: str) -> str:
    return job_name + SSH_AUTH_SECRET_SUFFIX


def hostfile_configmap_name(job_name: str) -> str:
    return job_name + HOSTFILE_CONFIGMAP_SUFFIX


class MPIPlugin(Plugin, Validator, MLPolicyEnforcer, Renderer):
    """Launcher, node count, hostfile, SSH keys and ``OMPI_MCA_*`` env for ``mlPolicy.mpi`` runtimes.

    Phases: validate, ML policy, render (the SSH keys Secret and the hostfile ConfigMap)."""

    name = "mpi"

    def enabled(self, ctx: Context) -> bool:
        policy = ctx.runtime.spec.ml_policy
        return policy is not None and policy.mpi is not None

    def validate(self, ctx: Context) -> list[ValidationError]:
        source = _source(ctx)
        problems = []
        implementation = source.mpi_implementation or "OpenMPI"
        if implementation not in SUPPORTED_IMPLEMENTATIONS:
            problems.append(ValidationError(
                "spec.mlPolicy.mpi.mpiImplementation",
                f"{quote(implementation)} is not supported; supported: {', '.join(SUPPORTED_IMPLEMENTATIONS)}",
            ))
        jobs = {p.name for p in ctx.plan.pod_sets}
        missing = [name for name in (LAUNCHER, NODE) if name not in jobs]
        if missing:
            problems.append(ValidationError(
                "spec.template.spec.replicatedJobs",
                f"runtime {ctx.runtime.name!r} has mlPolicy.mpi but no {' or '.join(repr(m) for m in missing)} job; "
                f"an MPI runtime needs a {LAUNCHER!r} job (runs mpirun) and a {NODE!r} job (the hosts), "
                f"it has: {', '.join(sorted(jobs))}",
            ))
        trainer = ctx.trainjob.spec.trainer
        setting = trainer.num_proc_per_node if trainer is not None else None
        if setting is not None and not isinstance(setting, int):
            problems.append(ValidationError(
                "spec.trainer.numProcPerNode",
                f"must be an integer for MPI runtime {ctx.runtime.name!r} (the hostfile's slots per node), "
                f"got {quote(setting)}",
            ))
        return problems

    def enforce_ml_policy(self, ctx: Context) -> None:
        plan, source = ctx.plan, _source(ctx)
        jobs = {p.name: p for p in plan.pod_sets}
        launcher, node = jobs[LAUNCHER], jobs[NODE]
        as_node = bool(source.run_launcher_as_node)
        requested = requested_num_nodes(ctx.trainjob, ctx.runtime)
        launcher.count = launcher.replicas = 1
        node.replicas = 1
        node.count = max(requested - 1, 1) if as_node else requested
        launcher_container = _container(launcher)
        if as_node:
            _share_trainer_settings(ctx, _container(node))
        policy = MPIPolicy(
            implementation=source.mpi_implementation or "OpenMPI",
            slots=_slots(ctx, source, launcher_container.resources),
            ssh_auth_mount_path=source.ssh_auth_mount_path or DEFAULT_SSH_AUTH_MOUNT_PATH,
            run_launcher_as_node=as_node,
        )
        policy.hosts = [_host(plan, launcher, 0)] if as_node else []
        policy.hosts += [_host(plan, node, i) for i in range(node.count)]
        plan.mpi = policy
        plan.ml_policy = "mpi"
        plan.num_nodes = len(policy.hosts)
        plan.num_proc_per_node = policy.slots
        _mount_secrets(plan, launcher, node)
        upsert_env(launcher_container, openmpi_env(policy))

    def render(self, plan: Plan) -> list[dict[str, Any]]:
        """The SSH keys Secret and hostfile ConfigMap of an MPI plan, labelled with the job's name."""
        if plan.mpi is None:
            return []
        objects = [render_ssh_auth_secret(plan), render_hostfile_configmap(plan)]
        for obj in objects:
            obj["metadata"]["labels"] = {TRAINJOB_NAME_LABEL: plan.job_name}
        return objects


def render_ssh_auth_secret(plan: Plan) -> dict[str, Any]:
    """The immutable ``kubernetes.io/ssh-auth`` Secret with a freshly generated key pair."""
    private, public = generate_ssh_key_pair()
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": ssh_auth_secret_name(plan.job_name), "namespace": plan.namespace},
        "type": "kubernetes.io/ssh-auth",
        "immutable": True,
        "data": {
            SSH_PRIVATE_KEY: base64.b64encode(private).decode(),
            SSH_PUBLIC_KEY: base64.b64encode(public).decode(),
        },
    }


def render_hostfile_configmap(plan: Plan) -> dict[str, Any]:
    """The ConfigMap holding the hostfile ``mpirun`` reads on the launcher."""
    assert plan.mpi is not None
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": hostfile_configmap_name(plan.job_name), "namespace": plan.namespace},
        "data": {HOSTFILE_NAME: plan.mpi.hostfile()},
    }


def generate_ssh_key_pair() -> tuple[bytes, bytes]:
    """An Ed25519 key pair: (OpenSSH private key, ``ssh-ed25519 AAAA...`` public key line).

    Made with ``cryptography`` when it is installed, else with ``ssh-keygen``."""
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    except ImportError:
        return _ssh_keygen_pair()
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return private, public + b"\n"


def _ssh_keygen_pair() -> tuple[bytes, bytes]:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "id"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", str(path)],
                       check=True, capture_output=True)
        return path.read_bytes(), path.with_suffix(".pub").read_bytes()


def _source(ctx: Context) -> MPIMLPolicy:
    return ctx.runtime.spec.ml_policy.mpi  # type: ignore[union-attr,return-value]


def _container(pod_set: PodSet) -> Container:
    """The ``node`` container of a pod set (Kubeflow's MPI settings go to the container of that name)."""
    for container in pod_set.containers:
        if container.name == TRAINER_CONTAINER:
            return container
    if not pod_set.containers:
        raise ValidationError(
            f"spec.template.spec.replicatedJobs[{pod_set.name}]",
            f"an MPI runtime's {pod_set.name!r} job needs a container (Kubeflow's MPI settings go to the one named "
            f"{TRAINER_CONTAINER!r})",
        )
    return pod_set.containers[0]


def _host(plan: Plan, pod_set: PodSet, index: int) -> str:
    return f"{plan.job_name}-{pod_set.name}-0-{index}.{plan.job_name}"


def _slots(ctx: Context, source: MPIMLPolicy, resources: Resources) -> int:
    trainer = ctx.trainjob.spec.trainer
    if trainer is not None and isinstance(trainer.num_proc_per_node, int):
        return trainer.num_proc_per_node
    slots = source.num_proc_per_node or 1
    gpus = gpu_count(resources.effective())
    return gpus if slots == 1 and gpus > 1 else slots


def _share_trainer_settings(ctx: Context, container: Container) -> None:
    """With ``runLauncherAsNode`` the node pods train too: they get the TrainJob's env and resources."""
    trainer = ctx.trainjob.spec.trainer
    if trainer is None:
        return
    if trainer.env:
        upsert_env(container, [env_from_api(var) for var in trainer.env])
    res = trainer.resources_per_node
    if res is not None and (res.requests or res.limits):
        container.resources = Resources(
            requests={k: str(v) for k, v in (res.requests or {}).items()},
            limits={k: str(v) for k, v in (res.limits or {}).items()},
            claims=[c.to_dict() for c in res.claims or []],
        )


def _mount_secrets(plan: Plan, launcher: PodSet, node: PodSet) -> None:
    assert plan.mpi is not None
    ssh_volume = {
        "name": SSH_AUTH_VOLUME,
        "secret": {
            "secretName": ssh_auth_secret_name(plan.job_name),
            "items": [
                {"key": SSH_PRIVATE_KEY, "path": "id_rsa"},
                {"key": SSH_PUBLIC_KEY, "path": "id_rsa.pub"},
                {"key": SSH_PUBLIC_KEY, "path": "authorized_keys"},
            ],
        },
    }
    hostfile_volume = {
        "name": HOSTFILE_VOLUME,
        "configMap": {
            "name": hostfile_configmap_name(plan.job_name),
            "items": [{"key": HOSTFILE_NAME, "path": HOSTFILE_NAME, "mode": 0o444}],
        },
    }
    for pod_set, volumes in ((launcher, [ssh_volume, hostfile_volume]), (node, [ssh_volume])):
        spec = pod_spec(pod_set.template)
        names = {v["name"] for v in volumes}
        spec["volumes"] = [v for v in spec.get("volumes") or [] if v.get("name") not in names] + volumes
        mounts = [{"name": SSH_AUTH_VOLUME, "mountPath": plan.mpi.ssh_auth_mount_path}]
        if pod_set is launcher:
            mounts.append({"name": HOSTFILE_VOLUME, "mountPath": HOSTFILE_DIR})
        container = _container(pod_set)
        paths = {m["mountPath"] for m in mounts}
        container.volume_mounts = [m for m in container.volume_mounts if m.get("mountPath") not in paths] + mounts
