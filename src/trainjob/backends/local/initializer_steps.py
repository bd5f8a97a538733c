"""The pod sets a job's trainer waits for, run on this machine as processes before its nodes.

A runtime's ``dataset-initializer`` and ``model-initializer`` replicated jobs (by the ``trainjob-ancestor-step``
label or by name), and any replicated job the trainer ``dependsOn`` (directly or through another), each become one
process, in dependency order, started by the supervisor before the nodes (:mod:`.supervisor.initializers`); the
trainer starts only once every one has exited 0, and a failure fails the job. What each runs:

===========================================  ===================================================================
the container has a ``command``              that command (Kubeflow's ``python -m pkg.initializers.dataset`` is
                                             ``python -m trainjob.initializers dataset``)
no command, an initializer step or image     ``python -m trainjob.initializers dataset|model``: Kubeflow's
(``ghcr.io/kubeflow/trainer/*-initializer``,  images' contract, from the container's env (``STORAGE_URI`` ...,
trainjob's image, or none)                   :mod:`trainjob.initializers.config`)
no command otherwise                         refused at submit: nothing here knows what the image would run
===========================================  ===================================================================

``dependsOn`` with ``status: Ready`` (start the trainer once the other job's pods are ready, a server alongside
training) is refused at submit. Pod sets the trainer does not wait for and that are no initializer are not run
(a ``PodSetSkipped`` event says so).

Where the files go: Kubeflow's initializers write ``/workspace/dataset`` and ``/workspace/model`` and its trainers
read them there. When the trainer mounts nothing at ``/workspace``, the job gets one folder for it
(``<job dir>/workspace``, volume ``initializer``, shared by its nodes like the JobSet's claim of Kubeflow's
LLM runtimes); a mount the runtime declares (a ``volumeClaimPolicies`` claim, a PVC, a ``hostPath``) is used as
it is. The initializer process writes to that folder's host path (``TRAINJOB_INITIALIZER_TARGET``), through the
machine's download cache (:mod:`trainjob.initializers.cache`, ``$TRAINJOB_HOME/cache/data``; ``TRAINJOB_DATA_CACHE``
names another folder, or ``off``: :func:`trainjob.initializers.cache.data_cache_dir`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainjob.errors import ValidationError

if TYPE_CHECKING:
    from trainjob.backends.local.volumes import HostVolumes
    from trainjob.runtime.plan import Plan, PodSet

DATASET_STEP = "dataset-initializer"
MODEL_STEP = "model-initializer"
INITIALIZER_STEPS = {DATASET_STEP: "dataset", MODEL_STEP: "model"}
#: The volume a job gets for ``/workspace`` when its trainer mounts nothing there (Kubeflow's volume name).
WORKSPACE_VOLUME = "initializer"
WORKSPACE_PATH = "/workspace"


@dataclass
class StepProcessSpec:
    """One pod set run before the nodes: its name, command and env (the pod's, with the target's host path)."""

    name: str
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)
    #: ``dataset`` or ``model`` for trainjob's initializer; ``""`` for a command of the runtime's own.
    kind: str = ""


def steps_before_trainer(plan: Plan) -> list[PodSet]:
    """The pod sets to run before the trainer, dependencies first; ``ValidationError`` for what cannot run here."""
    from trainjob.api.errors import quote

    trainer = plan.trainer()
    by_name = {p.name: p for p in plan.pod_sets}
    ordered: list[PodSet] = []

    def visit(pod_set: PodSet, path: str, seen: tuple[str, ...]) -> None:
        for index, dependency in enumerate(pod_set.depends_on):
            where = f"{path}.dependsOn[{index}]"
            name = dependency.get("name") if isinstance(dependency, dict) else None
            if not isinstance(name, str) or name not in by_name or name in seen:
                raise ValidationError(f"{where}.name", f"no replicated job {quote(name)} to wait for (or a cycle); "
                                      f"replicated jobs: {', '.join(by_name)}")
            status = dependency.get("status", "Complete")  # type: ignore[union-attr]
            if status != "Complete":
                raise ValidationError(f"{where}.status", f"{quote(status)} (start once {name}'s pods are ready) is not "
                                      "supported on this machine, where steps run one after another; use "
                                      "'Complete', or run the job on Kubernetes")
            other = by_name[name]
            visit(other, f"spec.template.spec.replicatedJobs[{name}]", (*seen, name))
            if other not in ordered:
                ordered.append(other)

    visit(trainer, f"spec.template.spec.replicatedJobs[{trainer.name}]", (trainer.name,))
    for pod_set in plan.pod_sets:
        if pod_set is not trainer and pod_set not in ordered and step_kind(pod_set):
            ordered.append(pod_set)
    return ordered


def step_kind(pod_set: PodSet) -> str:
    """``dataset`` / ``model`` for an initializer pod set (its step label, its name or Kubeflow's image), else ''."""
    kind = INITIALIZER_STEPS.get(pod_set.ancestor_step or "") or INITIALIZER_STEPS.get(pod_set.name, "")
    if kind:
        return kind
    from trainjob.initializers.config import kubeflow_initializer_kind

    return kubeflow_initializer_kind(pod_set.containers[0].image or "") if pod_set.containers else ""


def step_process_spec(pod_set: PodSet) -> StepProcessSpec:
    """How ``pod_set`` runs here (see the module's table); ``ValidationError`` when nothing says what to run."""
    from trainjob.initializers.config import kubeflow_module_to_ours
    from trainjob.runtime.template import main_container

    container = main_container(pod_set, pod_set.name)
    kind = step_kind(pod_set)
    command = [*container.command, *container.args]
    env = container.env_dict(0)
    if command:
        return StepProcessSpec(pod_set.name, kubeflow_module_to_ours(command), env, kind if _ours(command) else "")
    if kind:
        return StepProcessSpec(pod_set.name, ["python", "-m", "trainjob.initializers", kind], env, kind)
    raise ValidationError(
        f"spec.template.spec.replicatedJobs[{pod_set.name}].template.spec.template.spec.containers[0].command",
        f"the trainer waits for {pod_set.name}, and this machine runs a step's command (an image's entrypoint is "
        f"not used here); its container has none (image {container.image or 'none'}). Give it a command, or run "
        "the job on Kubernetes",
    )


def _ours(command: list[str]) -> bool:
    return "trainjob.initializers" in command


def needs_workspace(plan: Plan) -> bool:
    """Whether steps run before the trainer and its container mounts nothing at or under ``/workspace``."""
    mounts = plan.trainer().container().volume_mounts
    paths = [os.path.normpath(m.get("mountPath") or "/") for m in mounts]
    covered = any(p == WORKSPACE_PATH or p.startswith(WORKSPACE_PATH + "/") for p in paths)
    return not covered and bool(steps_before_trainer(plan))


def add_workspace(plan: Plan, job_dir: Path) -> None:
    """Give the trainer ``/workspace``: the job's folder ``workspace``, one for all nodes (see the module)."""
    from trainjob.runtime.template import pod_spec

    trainer = plan.trainer()
    spec = pod_spec(trainer.template)
    volume = {"name": WORKSPACE_VOLUME, "hostPath": {"path": str(job_dir / "workspace"), "type": "DirectoryOrCreate"}}
    spec["volumes"] = [v for v in spec.get("volumes") or [] if v.get("name") != WORKSPACE_VOLUME] + [volume]
    trainer.container().volume_mounts.append({"name": WORKSPACE_VOLUME, "mountPath": WORKSPACE_PATH})


def claim_template_volumes(plan: Plan, job_dir: Path) -> None:
    """Volumes the trainer mounts from the JobSet's ``volumeClaimPolicies`` (a claim per job on a cluster) become
    folders of the job's own here (``<job dir>/claims/<name>``), shared by its nodes and removed with it."""
    from trainjob.runtime.template import pod_spec

    templates = {
        (template.get("metadata") or {}).get("name")
        for policy in plan.jobset_spec.get("volumeClaimPolicies") or []
        for template in policy.get("templates") or []
    }
    trainer = plan.trainer()
    spec = pod_spec(trainer.template)
    declared = {v.get("name") for v in spec.get("volumes") or []}
    for mount in trainer.container().volume_mounts:
        name = mount.get("name")
        if name in templates and name not in declared:
            spec.setdefault("volumes", []).append(
                {"name": name, "hostPath": {"path": str(job_dir / "claims" / name), "type": "DirectoryOrCreate"}})
            declared.add(name)


#: What a step gets of the environment the job is created from, beside the pod's env: this machine's download
#: settings (a Hub endpoint and token, S3 credentials, proxies, CA bundles), as a node does not.
DOWNLOAD_ENV_PREFIXES = ("HF_", "HUGGING_FACE_", "AWS_")
DOWNLOAD_ENV = frozenset({"HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY", "http_proxy", "https_proxy",
                          "no_proxy", "all_proxy", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE", "SSL_CERT_DIR",
                          "CURL_CA_BUNDLE"})


def download_env(environ: Mapping[str, str]) -> dict[str, str]:
    """This machine's download settings in ``environ`` (:data:`DOWNLOAD_ENV`, :data:`DOWNLOAD_ENV_PREFIXES`)."""
    return {k: v for k, v in environ.items() if k in DOWNLOAD_ENV or k.startswith(DOWNLOAD_ENV_PREFIXES)}


def place_steps(steps: list[StepProcessSpec], host_volumes: HostVolumes | None, cache_dir: str | None,
                environ: Mapping[str, str]) -> None:
    """Point each step at the host paths behind the trainer's mounts: trainjob's initializer gets its target
    (``/workspace/dataset`` as the nodes will see it) and the cache; a command of the runtime's own gets its
    arguments and env rewritten as under the ``env`` mount mechanism, and ``TRAINJOB_PATH_MAP``. Every step gets
    this machine's download settings from ``environ`` (:func:`download_env`) under its pod's env."""
    from trainjob.backends.local.volumes import PATH_MAP_ENV, rewrite_path
    from trainjob.initializers.config import CACHE_ENV, DEFAULT_TARGETS, TARGET_ENV

    mounts = host_volumes.mounts if host_volumes is not None else []
    mapping = {m.mount_path: m.host_path(0) for m in mounts if m.tmpfs_bytes is None}
    for step in steps:
        step.env = {**download_env(environ), **step.env}
        if step.kind:
            step.env[TARGET_ENV] = rewrite_path(DEFAULT_TARGETS[step.kind], mapping)
            if cache_dir:
                step.env[CACHE_ENV] = cache_dir
        else:
            step.command = [rewrite_path(arg, mapping) for arg in step.command]
            step.env = {k: rewrite_path(v, mapping) for k, v in step.env.items()}
        step.env[PATH_MAP_ENV] = json.dumps(mapping)


def steps_from_dicts(data: list[dict[str, Any]] | None) -> list[StepProcessSpec]:
    return [StepProcessSpec(**step) for step in data or []]
