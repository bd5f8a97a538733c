"""Gang scheduling: coscheduling and volcano PodGroup requirements, pod labels and annotations."""

from __future__ import annotations

import pytest

from trainjob.runtime import builtin_runtimes, resolve
from trainjob.runtime.render import render_objects

RESOURCES = {"requests": {"cpu": "2500m", "memory": "8Gi"}, "limits": {"cpu": "4", "nvidia.com/gpu": 1}}


def render_podgroup(plan):
    """The PodGroup among the plan's rendered objects, or ``None``."""
    return next((obj for obj in render_objects(plan) if obj["kind"] == "PodGroup"), None)


def _pod_meta(pod_set):
    return pod_set.template["spec"]["template"]["metadata"]


def test_coscheduling_counts_every_pod_and_sums_requests_over_limits(
    make_job, make_runtime, dataset_initializer_job
):
    runtime = make_runtime(
        mlPolicy={"torch": {}},
        podGroupPolicy={"coscheduling": {"scheduleTimeoutSeconds": 120}},
        container={"resources": RESOURCES},
        jobs=[dataset_initializer_job],
    )
    plan = resolve(make_job(runtime="rt", numNodes=4), runtime)
    group = plan.pod_group
    assert (group.scheduler, group.min_member, group.schedule_timeout_seconds) == ("coscheduling", 5, 120)
    assert group.min_resources == {"cpu": "11", "memory": "32Gi", "nvidia.com/gpu": "4"}
    assert all(_pod_meta(p)["labels"]["scheduling.x-k8s.io/pod-group"] == "mnist" for p in plan.pod_sets)


def test_coscheduling_timeout_defaults_to_sixty_seconds(make_job, make_runtime):
    plan = resolve(
        make_job(runtime="rt"), make_runtime(mlPolicy={"torch": {}}, podGroupPolicy={"coscheduling": {}})
    )
    assert render_podgroup(plan)["spec"] == {"minMember": 1, "scheduleTimeoutSeconds": 60}


def test_volcano_annotates_pods_names_the_scheduler_and_takes_the_queue_from_the_job(make_job):
    job = make_job(
        runtime="torch-distributed-volcano",
        numNodes=2,
        spec={"annotations": {"scheduling.volcano.sh/queue-name": "research"}},
        resourcesPerNode={"limits": {"nvidia.com/gpu": 8}},
    )
    plan = resolve(job, builtin_runtimes()["torch-distributed-volcano"])
    assert (plan.pod_group.scheduler, plan.pod_group.min_member, plan.pod_group.queue) == (
        "volcano",
        2,
        "research",
    )
    trainer = plan.trainer()
    assert _pod_meta(trainer)["annotations"]["scheduling.k8s.io/group-name"] == "mnist"
    assert trainer.template["spec"]["template"]["spec"]["schedulerName"] == "volcano"
    assert render_podgroup(plan)["spec"] == {
        "minMember": 2,
        "minResources": {"nvidia.com/gpu": "16"},
        "queue": "research",
    }


def test_volcano_keeps_a_scheduler_the_template_names_and_passes_network_topology(make_job, make_runtime):
    runtime = make_runtime(
        mlPolicy={"torch": {}},
        podGroupPolicy={"volcano": {"networkTopology": {"mode": "hard", "highestTierAllowed": 2}}},
        container={},
    )
    runtime.spec.template.spec.replicated_jobs[0].template["spec"]["template"]["spec"]["schedulerName"] = (
        "custom"
    )
    plan = resolve(make_job(runtime="rt"), runtime)
    assert plan.trainer().template["spec"]["template"]["spec"]["schedulerName"] == "custom"
    assert render_podgroup(plan)["spec"]["networkTopology"] == {"mode": "hard", "highestTierAllowed": 2}


@pytest.mark.parametrize("policy", [{"coscheduling": {}}, {"volcano": {}}])
def test_an_elastic_gang_waits_for_min_nodes_only(make_job, make_runtime, policy):
    runtime = make_runtime(
        mlPolicy={"torch": {"elasticPolicy": {"minNodes": 2, "maxNodes": 5}}},
        podGroupPolicy=policy,
        container={"resources": {"requests": {"cpu": "1"}}},
    )
    plan = resolve(make_job(runtime="rt"), runtime)
    assert (plan.trainer().count, plan.pod_group.min_member, plan.pod_group.min_resources) == (
        5,
        2,
        {"cpu": "2"},
    )


def test_without_pod_group_policy_there_is_no_pod_group(make_job):
    plan = resolve(make_job(), builtin_runtimes()["torch-distributed"])
    assert plan.pod_group is None and render_podgroup(plan) is None
