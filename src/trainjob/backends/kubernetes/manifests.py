"""What ``trainjob install`` puts on a cluster, generated here so that deploy/ can never drift from the code.

``install_manifests()`` returns, in apply order: the namespace, the three CRDs and the PyTorchJob one (skipped where the Training Operator's is installed), least-privilege RBAC, the operator
Deployment (probes, requests, non-root), the built-in ClusterTrainingRuntimes and Kubeflow Trainer's public version
ConfigMap (:func:`kubeflow_version`), which ``apply_manifests`` creates only where Kubeflow's own is absent. ``deploy_files()`` lays the same
objects out as a kustomization (what deploy/ holds; a test compares them)::

    print(manifests_yaml(install_manifests(image="registry.example.com/trainjob-operator:0.1.0")))
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

from trainjob import __version__
from trainjob.backends.kubernetes.crds import custom_resource_definitions, pytorchjob_crd
from trainjob.backends.kubernetes.initializer_pods import DEFAULTS_CONFIGMAP, INITIALIZER_IMAGE_ENV
from trainjob.backends.kubernetes.resources import (
    API_GROUP,
    CLUSTER_TRAINING_RUNTIMES,
    COSCHEDULING_PODGROUPS,
    CRDS,
    JOBS,
    JOBSETS,
    OPERATOR_NAMESPACE,
    PYTORCHJOBS,
    TRAINING_RUNTIMES,
    TRAINJOBS,
    VOLCANO_PODGROUPS,
)
from trainjob.backends.kubernetes.snapshot import KEY_SECRET
from trainjob.backends.kubernetes.status_server import CA_CONFIGMAP
from trainjob.backends.kubernetes.tls import TLS_SECRET
from trainjob.constants import KUBEFLOW_TRAINER_VERSION

NAMESPACE = OPERATOR_NAMESPACE
NAME = "trainjob-operator"
#: The ``coordination.k8s.io`` Lease the operator's replicas elect their leader on (in :data:`NAMESPACE`).
LEASE_NAME = NAME
DEFAULT_IMAGE = f"ghcr.io/trainjob/trainjob-operator:{__version__}"
LIVENESS_PORT = 8080
STATUS_PORT = 8443
METRICS_PORT = 8081
#: Replicas of the operator Deployment (one leads; the other takes over within the lease duration).
OPERATOR_REPLICAS = 2
#: Each operator replica's CPU request (``install --operator-cpu``): the leader's steady use on a busy cluster.
OPERATOR_CPU_REQUEST = "100m"
#: The EndpointSlice of the operator Service, which the leading replica points at its own pod (as the API server
#: publishes itself behind the ``kubernetes`` Service): the pods' reports reach the leader, while every healthy
#: replica is ready, so a rolling update can replace them.
LEADER_ENDPOINT_SLICE = f"{NAME}-leader"
#: Where the jobs' pods reach the status endpoint: the operator Service.
STATUS_URL = f"https://{NAME}.{NAMESPACE}.svc:{STATUS_PORT}"
_LABELS = {"app.kubernetes.io/name": NAME, "app.kubernetes.io/part-of": "trainjob"}
#: Where the Kubeflow SDK reads the control plane's version (``KUBEFLOW_SYSTEM_NAMESPACE`` overrides the namespace).
KUBEFLOW_NAMESPACE = "kubeflow-system"
KUBEFLOW_VERSION_CONFIGMAP = "kubeflow-trainer-public"
#: Objects with this annotation are created when absent and never changed (they may be Kubeflow Trainer's own).
CREATE_ONLY_ANNOTATION = "trainjob/create-only"


def namespace() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE, "labels": dict(_LABELS)}}


def rbac() -> list[dict[str, Any]]:
    """A ServiceAccount, a ClusterRole with exactly what the operator calls (jobs live in every namespace), and a
    Role in the operator's namespace for the one Secret that holds its snapshot-signing key and the Lease its
    replicas elect a leader on."""
    rules = [
        {
            "apiGroups": [API_GROUP],
            "resources": [TRAINJOBS.plural],
            # read from the watch (list, watch), never one by one; delete: finished jobs past their
            # trainjob/ttl-seconds-after-finished annotation
            "verbs": ["list", "watch", "patch", "delete"],
        },
        {"apiGroups": [API_GROUP], "resources": [f"{TRAINJOBS.plural}/status"], "verbs": ["patch"]},
        {
            "apiGroups": [API_GROUP],
            "resources": [TRAINING_RUNTIMES.plural, CLUSTER_TRAINING_RUNTIMES.plural],
            # watched; get: a runtime created a moment before its job, not yet delivered by the watch
            "verbs": ["get", "list", "watch"],
        },
        {
            "apiGroups": [JOBSETS.group],
            "resources": [JOBSETS.plural],
            # watched; get: a create that met a JobSet the watch had not delivered yet (409)
            "verbs": ["get", "list", "watch", "create", "patch", "delete"],
        },
        # the JobSets' child Jobs, watched for their pod counts (a job whose pods are still coming up is not
        # looked at: .pod_start)
        {"apiGroups": [JOBS.group], "resources": [JOBS.plural], "verbs": ["list", "watch"]},
        {
            "apiGroups": [COSCHEDULING_PODGROUPS.group, VOLCANO_PODGROUPS.group],
            "resources": ["podgroups"],
            "verbs": ["create", "delete"],
        },
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
        # An MPI job's SSH key Secret and hostfile ConfigMap (owned by the job: deleted with it); never read.
        {"apiGroups": [""], "resources": ["secrets", "configmaps"], "verbs": ["create"]},
        # A job's /workspace claim for its initializers and trainer (owned by the job: deleted with it).
        {"apiGroups": [""], "resources": ["persistentvolumeclaims"], "verbs": ["create"]},
        # The status endpoint's CA in each namespace with jobs, which their pods project (made with `create`);
        # patch: a CA that differs from the operator's
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "patch"], "resourceNames": [CA_CONFIGMAP]},
        # the operator's namespace owns those ConfigMaps: deleting it deletes them
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"], "resourceNames": [NAMESPACE]},
        # A failed job's message names the failing rank's exception: from its pods' status, else their logs.
        # get: the pod a status report's token was issued to (the status endpoint)
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
        # the status endpoint checks the pods' projected tokens (audience trainer.kubeflow.org)
        {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
        # A stalled job's node group restarted (trainjob/stall-action: restart): its pods evicted, so the Job
        # controller replaces them as it does preempted ones.
        {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
        # The pods a suspension stops, and the peers of a disrupted pod, are marked DisruptionTarget (their status)
        # so that their exits never fail the job; the peers are then deleted (:mod:`.disruptions`).
        {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"]},
        # PyTorchJobs (kubeflow.org/v1): whether their CRD is trainjob's, the jobs (delete: their TTL), their
        # status, and the pods and headless services the operator runs them with.
        {"apiGroups": [CRDS.group], "resources": [CRDS.plural], "verbs": ["get"],
         "resourceNames": [f"{PYTORCHJOBS.plural}.{PYTORCHJOBS.group}"]},
        {"apiGroups": [PYTORCHJOBS.group], "resources": [PYTORCHJOBS.plural],
         "verbs": ["get", "list", "watch", "delete"]},
        {"apiGroups": [PYTORCHJOBS.group], "resources": [f"{PYTORCHJOBS.plural}/status"], "verbs": ["patch"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["watch", "create", "delete"]},
        {"apiGroups": [""], "resources": ["services"], "verbs": ["create", "delete"]},
    ]
    key_rules = [
        # `create` cannot be limited to a name; the Role only covers the operator's own namespace.
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"], "resourceNames": [KEY_SECRET, TLS_SECRET]},
        # the status endpoint's certificate, issued again when it must name another host
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["update"], "resourceNames": [TLS_SECRET]},
        # the cluster's settings for every initializer (HF_ENDPOINT ...), read when a job's JobSet is made
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"], "resourceNames": [DEFAULTS_CONFIGMAP]},
        # `trainjob operator --leader-elect`: the Lease the replicas elect their leader on, and the operator
        # Service's EndpointSlice, which the leader points at itself (and reads before it empties it on stepping
        # down: only while it still names its own pod)
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["create"]},
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "patch"],
         "resourceNames": [LEADER_ENDPOINT_SLICE]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "update"],
         "resourceNames": [LEASE_NAME]},
    ]
    meta = {"name": NAME, "labels": dict(_LABELS)}
    subjects = [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}]
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {**meta, "namespace": NAMESPACE}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": meta,
            "rules": rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": meta,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NAME},
            "subjects": subjects,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {**meta, "namespace": NAMESPACE},
            "rules": key_rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {**meta, "namespace": NAMESPACE},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": NAME},
            "subjects": subjects,
        },
    ]


@dataclass(frozen=True)
class OperatorPlacement:
    """Where the operator's pods run (``install --operator-node-selector``, ``--operator-toleration``,
    ``--operator-priority-class``): a node pool of the cluster's own components, as a control plane or system pool
    is, so that the training pods' load never delays the operator's status writes."""

    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    priority_class: str | None = None

    def apply(self, pod_spec: dict[str, Any]) -> None:
        if self.node_selector:
            pod_spec["nodeSelector"] = dict(self.node_selector)
        if self.tolerations:
            pod_spec["tolerations"] = [dict(t) for t in self.tolerations]
        if self.priority_class:
            pod_spec["priorityClassName"] = self.priority_class


def deployment(image: str = DEFAULT_IMAGE, replicas: int = OPERATOR_REPLICAS,
               cpu_request: str = OPERATOR_CPU_REQUEST, initializer_image: str | None = None,
               placement: OperatorPlacement | None = None) -> dict[str, Any]:
    """The operator's replicas (0 when the operator runs elsewhere): they elect a leader on a Lease; only the leader
    reconciles and serves the status endpoint, and it points the Service's EndpointSlice
    (:data:`LEADER_ENDPOINT_SLICE`) at its own pod. Every healthy replica is ready (followers answer the probes while they wait), so a rolling update
    replaces them one by one; the leader's pod goes last or first, and a follower takes the Lease it releases.
    Prometheus metrics on ``metrics``. The root file system is read-only; ``/tmp`` is an emptyDir (the status
    endpoint's TLS files pass through it). ``initializer_image``: the image Kubeflow's initializer images run as
    (:mod:`.initializer_pods`); ``placement``: the nodes its pods run on, and their priority."""
    probe = {"httpGet": {"path": "/healthz", "port": LIVENESS_PORT}, "periodSeconds": 10, "timeoutSeconds": 5}
    container = {
        "name": "operator",
        "image": image,
        "command": ["trainjob", "operator", "--liveness", f"http://0.0.0.0:{LIVENESS_PORT}/healthz",
                    "--leader-elect", "--status-url", STATUS_URL, "--status-port", str(STATUS_PORT),
                    "--metrics-port", str(METRICS_PORT)],
        "ports": [{"name": "health", "containerPort": LIVENESS_PORT},
                  {"name": "status", "containerPort": STATUS_PORT},
                  {"name": "metrics", "containerPort": METRICS_PORT}],
        "livenessProbe": {**probe, "initialDelaySeconds": 15, "failureThreshold": 3},
        "readinessProbe": {**probe, "periodSeconds": 5, "initialDelaySeconds": 2},
        # where the leader points the operator Service (its EndpointSlice)
        "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                *([{"name": INITIALIZER_IMAGE_ENV, "value": initializer_image}] if initializer_image else [])],
        "resources": {"requests": {"cpu": cpu_request, "memory": "128Mi"}, "limits": {"memory": "512Mi"}},
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    scrape = {"prometheus.io/scrape": "true", "prometheus.io/port": str(METRICS_PORT), "prometheus.io/path": "/metrics"}
    pod_spec: dict[str, Any] = {
        "serviceAccountName": NAME,
        "securityContext": {
            "runAsUser": 65532,
            "runAsGroup": 65532,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}],
    }
    if placement is not None:
        placement.apply(pod_spec)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": NAME, "namespace": NAMESPACE, "labels": dict(_LABELS)},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app.kubernetes.io/name": NAME}},
            "template": {
                "metadata": {"labels": dict(_LABELS), "annotations": scrape},
                "spec": pod_spec,
            },
        },
    }


def service() -> dict[str, Any]:
    """The operator's Service: the status endpoint the jobs' pods report to and the leader's metrics port. It has no
    selector: the leader writes its one EndpointSlice (:data:`LEADER_ENDPOINT_SLICE`)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": NAME, "namespace": NAMESPACE, "labels": dict(_LABELS)},
        "spec": {
            "ports": [{"name": "status", "port": STATUS_PORT, "targetPort": STATUS_PORT},
                      {"name": "metrics", "port": METRICS_PORT, "targetPort": METRICS_PORT}],
        },
    }


#: The built-in runtimes whose containers run torchrun (``install --torch-image`` sets their image).
TORCH_RUNTIMES = ("torch-distributed", "torch-distributed-volcano")


def builtin_runtimes(torch_image: str | None = None) -> list[dict[str, Any]]:
    """The built-in ClusterTrainingRuntimes as objects. ``torch_image`` replaces the image of the torch runtimes'
    containers (``torch-distributed``, ``torch-distributed-volcano``): a cluster's own build of
    ``deploy/training.Dockerfile``, or a mirror of the default image in a registry the nodes can reach."""
    from trainjob.runtime import builtin_runtimes as runtimes

    objects = [runtime.to_dict() for _, runtime in sorted(runtimes().items())]
    if torch_image:
        for obj in objects:
            if obj["metadata"]["name"] in TORCH_RUNTIMES:
                for rj in obj["spec"]["template"]["spec"]["replicatedJobs"]:
                    for container in rj["template"]["spec"]["template"]["spec"].get("containers", []):
                        container["image"] = torch_image
    return objects


def kubeflow_version() -> list[dict[str, Any]]:
    """Namespace ``kubeflow-system`` and ConfigMap ``kubeflow-trainer-public`` (``kubeflow_trainer_version``), which
    the Kubeflow SDK's ``TrainerClient`` reads on start and warns without, readable by every authenticated user as
    Kubeflow Trainer makes it. All are create-only: a cluster that also runs Kubeflow Trainer keeps its values."""
    create_only = {CREATE_ONLY_ANNOTATION: "true"}
    meta = {"name": KUBEFLOW_VERSION_CONFIGMAP, "namespace": KUBEFLOW_NAMESPACE, "labels": dict(_LABELS),
            "annotations": create_only}
    return [
        {"apiVersion": "v1", "kind": "Namespace",
         "metadata": {"name": KUBEFLOW_NAMESPACE, "labels": dict(_LABELS), "annotations": create_only}},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta,
         "data": {"kubeflow_trainer_version": KUBEFLOW_TRAINER_VERSION}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta,
         "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"],
                    "resourceNames": [KUBEFLOW_VERSION_CONFIGMAP]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta,
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": KUBEFLOW_VERSION_CONFIGMAP},
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:authenticated"}]},
    ]


def install_manifests(image: str = DEFAULT_IMAGE, operator_replicas: int = OPERATOR_REPLICAS,
                      torch_image: str | None = None,
                      operator_cpu: str = OPERATOR_CPU_REQUEST,
                      initializer_image: str | None = None,
                      initializer_env: dict[str, str] | None = None,
                      placement: OperatorPlacement | None = None) -> list[dict[str, Any]]:
    """Everything to install, in apply order (CRDs before the runtimes that need them); ``torch_image``: see
    :func:`builtin_runtimes`; ``operator_cpu``: each operator replica's CPU request; ``initializer_image`` (default
    ``torch_image``): what Kubeflow's initializer images run as; ``initializer_env``: every initializer's env
    (:func:`initializer_env_configmap`); ``placement``: the operator's nodes and priority."""
    return [
        namespace(),
        *custom_resource_definitions(),
        pytorchjob_crd(),
        *rbac(),
        deployment(image, operator_replicas, operator_cpu, initializer_image or torch_image, placement),
        service(),
        *([initializer_env_configmap(initializer_env)] if initializer_env else []),
        *builtin_runtimes(torch_image),
        *kubeflow_version(),
    ]


def initializer_env_configmap(env: dict[str, str]) -> dict[str, Any]:
    """ConfigMap :data:`~.initializer_pods.DEFAULTS_CONFIGMAP`: ``env`` for every initializer container."""
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": DEFAULTS_CONFIGMAP, "namespace": NAMESPACE, "labels": dict(_LABELS)},
            "data": dict(env)}


def manifests_yaml(objects: list[dict[str, Any]]) -> str:
    """Multi-document YAML, as ``kubectl apply -f -`` reads it."""
    return yaml.safe_dump_all(objects, sort_keys=False, default_flow_style=False)


def deploy_files(image: str = DEFAULT_IMAGE, torch_image: str | None = None) -> dict[str, str]:
    """deploy/'s generated files by relative path: a kustomization over namespace, CRDs, RBAC, operator, runtimes."""
    crds = [*custom_resource_definitions(), pytorchjob_crd()]
    files = {
        "namespace.yaml": manifests_yaml([namespace()]),
        **{f"crds/{crd['metadata']['name']}.yaml": manifests_yaml([crd]) for crd in crds},
        "rbac.yaml": manifests_yaml(rbac()),
        "operator.yaml": manifests_yaml([deployment(image), service()]),
        "runtimes.yaml": manifests_yaml(builtin_runtimes(torch_image)),
        "kubeflow-version.yaml": manifests_yaml(kubeflow_version()),
    }
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": list(files),
        "images": [{"name": DEFAULT_IMAGE.rsplit(":", 1)[0], "newTag": __version__}],
    }
    header = "# Generated by `trainjob install --write deploy/`; edit the code, not these files.\n"
    return {
        name: header + text
        for name, text in {"kustomization.yaml": manifests_yaml([kustomization]), **files}.items()
    }
