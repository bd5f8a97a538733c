"""``benchmarks/jobset_by_hand.py``: the renderings it times are what they say they are."""

from __future__ import annotations

import copy
import importlib.util
import sys
from pathlib import Path

import pytest

from trainjob.backends.kubernetes.status_server import StatusEndpoint, inject_status_client
from trainjob.constants import STALL_DUMP_ENV

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def by_hand():
    sys.path.insert(0, str(BENCHMARKS))  # it imports reconcile_kwok beside it
    try:
        spec = importlib.util.spec_from_file_location("benchmark_jobset_by_hand", BENCHMARKS / "jobset_by_hand.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(BENCHMARKS))


def rendered() -> dict:
    """A JobSet as a controller renders it, before any status client: a trainer with its own env and mount, an
    initializer container, a pod annotation of the runtime's."""
    pod = {
        "initContainers": [{"name": "init", "image": "busybox"}],
        "containers": [{"name": "node", "image": "pytorch", "env": [{"name": "PET_NNODES", "value": "4"}],
                        "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
        "volumes": [{"name": "data", "emptyDir": {}}],
    }
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": "wide", "namespace": "team"},
            "spec": {"replicatedJobs": [
                {"name": "node", "template": {"spec": {"template": {"metadata": {"annotations": {"runtime": "x"}},
                                                                    "spec": pod}}}},
                {"name": "other", "template": {"spec": {"template": {"spec": {
                    "containers": [{"name": "c", "image": "busybox"}]}}}}},
            ]}}


def test_the_bare_rendering_is_the_jobset_before_the_status_client_and_stall_setting(by_hand):
    before = rendered()
    jobset = copy.deepcopy(before)
    inject_status_client(jobset, StatusEndpoint("https://operator:8443", "-----BEGIN CERTIFICATE-----\n"))
    for template in by_hand.pod_templates(jobset):
        for container in template["spec"]["containers"]:
            container["env"].append({"name": STALL_DUMP_ENV, "value": "auto"})
    assert jobset != before

    assert by_hand.without_status_client(jobset) == before
    assert by_hand.size(by_hand.without_status_client(jobset)) < by_hand.size(jobset)


def test_the_padded_rendering_differs_by_one_annotation_of_the_asked_size(by_hand):
    before = rendered()

    padded = by_hand.padded(before, 1000)

    # the first template has an annotation already: the padding joins it
    assert by_hand.size(padded) - by_hand.size(before) == len(',"benchmark/padding":""') + 1000
    assert by_hand.pod_templates(padded)[1]["metadata"] == {"annotations": {"benchmark/padding": "x" * 1000}}
    assert before == rendered()  # the original is left as it was
