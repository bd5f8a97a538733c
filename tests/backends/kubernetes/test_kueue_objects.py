"""What trainjob says about Kueue without a cluster: the queues ``trainjob install --kueue`` prints, the labels
``--queue`` / ``--priority-class`` set, and where a waiting job stands, read from Workloads as Kueue writes them."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from click.testing import CliRunner, Result

from trainjob.backends.kubernetes.kueue import (
    QueueSetup,
    parse_toleration,
    queue_manifests,
    queue_state,
    waiting_for,
)
from trainjob.cli.jobs_run import queue_labels
from trainjob.cli.main import cli
from trainjob.errors import ValidationError


def _cli(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def test_install_kueue_prints_a_flavor_a_cluster_queue_and_a_local_queue() -> None:
    done = _cli("install", "--kueue", "--dry-run", "-n", "ml-team", "--queue", "team", "--cpu", "32",
                "--memory", "0", "--gpu", "8", "--node-label", "pool=a100", "--toleration", "gpu=true:NoSchedule",
                "--preempt-lower-priority")
    assert done.exit_code == 0, done.output
    flavor, cluster_queue, local_queue = yaml.safe_load_all(done.stdout)
    assert flavor["kind"] == "ResourceFlavor"
    assert flavor["spec"] == {"nodeLabels": {"pool": "a100"},
                              "tolerations": [{"key": "gpu", "operator": "Equal", "value": "true",
                                               "effect": "NoSchedule"}]}
    group = cluster_queue["spec"]["resourceGroups"][0]
    assert group["coveredResources"] == ["cpu", "nvidia.com/gpu"]  # a quota of 0 leaves the resource out
    assert group["flavors"] == [{"name": "default-flavor", "resources": [
        {"name": "cpu", "nominalQuota": "32"}, {"name": "nvidia.com/gpu", "nominalQuota": "8"}]}]
    assert cluster_queue["spec"]["preemption"] == {"withinClusterQueue": "LowerPriority"}
    assert local_queue["metadata"] == {"name": "team", "namespace": "ml-team"}
    assert local_queue["spec"] == {"clusterQueue": "cluster-queue"}


@pytest.mark.parametrize(("args", "says"), [
    (("--cpu", "lots"), "--cpu: must be a quantity"),
    (("--queue", "Team_A"), "--queue: must be a DNS label"),
    (("--toleration", "gpu"), "--toleration: expected KEY[=VALUE]:EFFECT"),
    (("--node-label", "pool"), "--node-label: expected KEY=VALUE"),
    (("--cpu", "0", "--memory", "0"), "no quota"),
    (("--write", "somewhere"), "--kueue and --write"),
])
def test_install_kueue_refuses_bad_input_naming_it(args: tuple[str, ...], says: str) -> None:
    done = _cli("install", "--kueue", "--dry-run", *args)
    assert done.exit_code == 2
    assert says in done.stderr, done.stderr
    assert done.stdout == ""


def test_queue_flags_become_kueue_labels() -> None:
    assert queue_labels("team", "high") == {"kueue.x-k8s.io/queue-name": "team",
                                            "kueue.x-k8s.io/priority-class": "high"}
    assert queue_labels(None, None) == {}
    with pytest.raises(ValidationError, match="--priority-class"):
        queue_labels("team", "High Priority")


def test_a_toleration_without_a_value_tolerates_any() -> None:
    assert parse_toleration("dedicated:NoExecute") == {"key": "dedicated", "operator": "Exists",
                                                       "effect": "NoExecute"}


def test_queue_manifests_validate_names() -> None:
    with pytest.raises(ValidationError, match="--cluster-queue"):
        queue_manifests(QueueSetup(cluster_queue="CQ"))


def _job(name: str, uid: str, queue: str | None = "team") -> dict[str, Any]:
    labels = {"kueue.x-k8s.io/queue-name": queue} if queue else {}
    return {"metadata": {"name": name, "uid": uid, "labels": labels}, "spec": {"suspend": True}}


def _workload(job: str, uid: str, priority: int, created: str, *conditions: dict[str, Any],
              queue: str = "team") -> dict[str, Any]:
    return {
        "metadata": {"name": f"trainjob-{job}", "uid": f"wl-{uid}", "creationTimestamp": created,
                     "ownerReferences": [{"kind": "TrainJob", "name": job, "uid": uid}]},
        "spec": {"queueName": queue, "priority": priority, "active": True},
        "status": {"conditions": list(conditions)},
    }


WAITING = {"type": "QuotaReserved", "status": "False", "reason": "Pending",
           "message": "couldn't assign flavors to pod set node: insufficient unused quota for cpu in flavor "
                      "default-flavor, 2 more needed"}
ADMITTED = {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved", "message": "Quota reserved"}


def test_a_waiting_job_is_placed_by_priority_then_age_among_its_queue() -> None:
    workloads = [
        _workload("running", "1", 1000, "2026-01-01T00:00:00Z", ADMITTED),
        _workload("old-low", "2", 100, "2026-01-01T00:00:01Z", WAITING),
        _workload("new-high", "3", 1000, "2026-01-01T00:00:05Z", WAITING),
        _workload("new-low", "4", 100, "2026-01-01T00:00:09Z", WAITING),
        _workload("elsewhere", "5", 5000, "2026-01-01T00:00:00Z", WAITING, queue="other"),
    ]
    assert queue_state(_job("new-high", "3"), workloads) == \
        "Queued (position 1 in LocalQueue team, waiting for cpu)"
    assert queue_state(_job("old-low", "2"), workloads) == "Queued (position 2 in LocalQueue team, waiting for cpu)"
    assert queue_state(_job("new-low", "4"), workloads) == "Queued (position 3 in LocalQueue team, waiting for cpu)"
    assert queue_state(_job("running", "1"), workloads) is None  # admitted: not queued
    assert queue_state(_job("plain", "9", queue=None), workloads) is None  # not through Kueue
    assert "no Workload yet" in (queue_state(_job("fresh", "8"), workloads) or "")


def test_what_a_workload_waits_for_is_kueues_words_when_not_quota() -> None:
    inactive = {"type": "QuotaReserved", "status": "False", "reason": "Inadmissible",
                "message": "ClusterQueue cq is inactive"}
    assert waiting_for(_workload("a", "1", 0, "t", inactive)) == "ClusterQueue cq is inactive"
    both = dict(WAITING, message="insufficient quota for cpu in flavor f, insufficient unused quota for memory in "
                                 "flavor f")
    assert waiting_for(_workload("a", "1", 0, "t", both)) == "cpu, memory"
