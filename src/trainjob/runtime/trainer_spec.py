"""``spec.trainer`` and ``spec.initializer`` of a TrainJob applied to its runtime's pod sets: the trainer
container (image, command, args, env, resources, the NCCL profile) and the dataset / model initializers
(``STORAGE_URI``, env, secret). The framework does this before any plugin runs (:func:`initial_plan
<trainjob.runtime.framework.initial_plan>`); :func:`requested_num_nodes` is the node count the ML plugins start from."""

from __future__ import annotations

from trainjob.api import InitializerSource, Runtime, Trainer, TrainJob
from trainjob.constants import (
    ANCESTOR_STEP_LABEL,
    DATASET_INITIALIZER,
    KUBEFLOW_INITIALIZER_IMAGES,
    MODEL_INITIALIZER,
    TRAINER_CONTAINER,
)
from trainjob.runtime.nccl import NCCL_PROFILE_ANNOTATION, apply_profile_annotation
from trainjob.runtime.plan import Container, EnvVar, PodSet, Resources
from trainjob.runtime.template import (
    container_from_dict,
    env_from_api,
    main_container,
    pod_spec,
    trainer_pod_set,
    upsert_env,
)

#: The env var that tells an initializer where to fetch the dataset or model from.
STORAGE_URI_ENV = "STORAGE_URI"


def requested_num_nodes(trainjob: TrainJob, runtime: Runtime) -> int:
    """``spec.trainer.numNodes``, else the runtime's ``mlPolicy.numNodes``, else 1."""
    trainer, policy = trainjob.spec.trainer, runtime.spec.ml_policy
    return (trainer.num_nodes if trainer else None) or (policy.num_nodes if policy else None) or 1


def apply_trainer(trainjob: TrainJob, trainer: PodSet, runtime: Runtime | None = None) -> None:
    """Put ``spec.trainer`` on the trainer's ``node`` container: set fields replace, ``env`` is merged by name,
    ``resourcesPerNode`` replaces the container's resources as a whole. Then the NCCL profile of annotation
    ``trainjob/nccl-profile`` (the job's, else ``runtime``'s) adds the variables the container does not set."""
    spec = trainjob.spec.trainer
    annotation_sets = [trainjob.metadata.annotations, runtime.metadata.annotations if runtime else None]
    if spec is None and not any(NCCL_PROFILE_ANNOTATION in (a or {}) for a in annotation_sets):
        return
    container = main_container(trainer, TRAINER_CONTAINER)
    if spec is not None:
        _apply_trainer_spec(spec, container)
    apply_profile_annotation(container, *annotation_sets)


def _apply_trainer_spec(spec: Trainer, container: Container) -> None:
    if spec.image is not None:
        container.image = spec.image
    if spec.command is not None:
        container.command = list(spec.command)
    if spec.args is not None:
        container.args = list(spec.args)
    if spec.env:
        upsert_env(container, [env_from_api(var) for var in spec.env])
    if spec.resources_per_node is not None:
        res = spec.resources_per_node
        container.resources = Resources(
            requests={k: str(v) for k, v in (res.requests or {}).items()},
            limits={k: str(v) for k, v in (res.limits or {}).items()},
            claims=[c.to_dict() for c in res.claims or []],
        )


def apply_initializers(trainjob: TrainJob, pod_sets: list[PodSet], runtime_name: str) -> None:
    """Pass ``spec.initializer.dataset`` / ``.model`` to the runtime's initializer jobs. A runtime without the job
    gets one (:func:`initializer_pod_set`, Kubeflow's image, which the operator runs as trainjob's initializer)
    that the trainer waits for, where Kubeflow refuses the job: any runtime can take an initializer."""
    initializer = trainjob.spec.initializer
    if initializer is None:
        return
    for step, source in ((DATASET_INITIALIZER, initializer.dataset), (MODEL_INITIALIZER, initializer.model)):
        if source is None:
            continue
        pod_set = next((p for p in pod_sets if step in (p.ancestor_step, p.name)), None)
        if pod_set is None:
            pod_set = initializer_pod_set(step)
            trainer = trainer_pod_set(pod_sets, runtime_name)
            pod_sets.insert(pod_sets.index(trainer), pod_set)
            trainer.depends_on.append({"name": step, "status": "Complete"})
        _apply_initializer_source(source, pod_set, step)


def initializer_pod_set(step: str) -> PodSet:
    """A one-pod replicated job ``step`` (``dataset-initializer`` / ``model-initializer``) running Kubeflow's
    initializer image, labelled as Kubeflow's runtimes label it."""
    container = {"name": step, "image": KUBEFLOW_INITIALIZER_IMAGES[step]}
    template = {"metadata": {"labels": {ANCESTOR_STEP_LABEL: step}},
                "spec": {"template": {"spec": {"containers": [container]}}}}
    return PodSet(name=step, count=1, containers=[container_from_dict(container)], ancestor_step=step,
                  template=template)


def _apply_initializer_source(source: InitializerSource, pod_set: PodSet, container_name: str) -> None:
    container = main_container(pod_set, container_name)
    variables: list[EnvVar] = []
    if source.storage_uri is not None:
        variables.append(EnvVar(name=STORAGE_URI_ENV, value=source.storage_uri))
    variables.extend(env_from_api(var) for var in source.env or [])
    upsert_env(container, variables)
    if source.secret_ref is not None:
        for spec_container in pod_spec(pod_set.template).get("containers") or []:
            if spec_container.get("name") == container.name:
                spec_container.setdefault("envFrom", []).append(
                    {"secretRef": {"name": source.secret_ref.name}}
                )
