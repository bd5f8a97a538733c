"""The local queue reads Kueue's labels: a WorkloadPriorityClass name means the value defined for it here."""

from __future__ import annotations

import pytest
from jobtest.local import trainjob_resource

from trainjob.backends.local.queue import Priority, job_priority, queue_name
from trainjob.errors import ValidationError


def job(labels=None, annotations=None):
    resource = trainjob_resource("j", ["python", "x.py"])
    resource.metadata.labels = labels
    resource.metadata.annotations = annotations
    return resource


@pytest.mark.parametrize(
    ("labels", "annotations", "env", "config", "priority"),
    [
        (None, None, None, None, Priority()),
        (None, {"trainjob/priority": "7"}, None, None, Priority(7, "annotation trainjob/priority")),
        ({"kueue.x-k8s.io/priority-class": "high"}, None, "high=1000,low=-10", None,
         Priority(1000, "kueue.x-k8s.io/priority-class high")),
        ({"kueue.x-k8s.io/priority-class": "low"}, None, None, "priority_classes: {high: 1000, low: -10}\n",
         Priority(-10, "kueue.x-k8s.io/priority-class low")),
        # the environment's value wins over the config file's
        ({"kueue.x-k8s.io/priority-class": "high"}, None, " high = 5 ", "priority_classes: {high: 1000}\n",
         Priority(5, "kueue.x-k8s.io/priority-class high")),
        # a class named by an integer is that integer, when nothing defines the name
        ({"kueue.x-k8s.io/priority-class": "300"}, None, None, None, Priority(300, "kueue.x-k8s.io/priority-class 300")),
        ({"kueue.x-k8s.io/priority-class": "300"}, None, "300=1", None, Priority(1, "kueue.x-k8s.io/priority-class 300")),
        # the job's own annotation wins, and says what it overrode
        ({"kueue.x-k8s.io/priority-class": "high"}, {"trainjob/priority": "-3"}, "high=1000", None,
         Priority(-3, "annotation trainjob/priority, over kueue.x-k8s.io/priority-class high")),
    ],
)
def test_priority_comes_from_the_annotation_else_the_class_value_defined_here(
        settings, labels, annotations, env, config, priority):
    settings("TRAINJOB_PRIORITY_CLASSES", env, config)

    assert job_priority(job(labels, annotations)) == priority


def test_an_unknown_priority_class_is_refused_naming_what_is_known_and_how_to_define_it(monkeypatch):
    monkeypatch.setenv("TRAINJOB_PRIORITY_CLASSES", "high=1000,low=-10")
    with pytest.raises(ValidationError) as caught:
        job_priority(job({"kueue.x-k8s.io/priority-class": "urgent"}))
    message = str(caught.value)
    assert message.startswith("metadata.labels[kueue.x-k8s.io/priority-class]: unknown WorkloadPriorityClass "
                              "'urgent': this machine has no Kueue, and the local queue knows high=1000, low=-10 "
                              "(TRAINJOB_PRIORITY_CLASSES)")
    assert "TRAINJOB_PRIORITY_CLASSES=urgent=1000" in message and "priority_classes:" in message


@pytest.mark.parametrize(
    ("env", "config", "message"),
    [
        ("high", None, "TRAINJOB_PRIORITY_CLASSES: must be NAME=INTEGER pairs separated by commas .*got 'high'"),
        ("high=soon", None, "got 'high=soon'"),
        ("high=99999999999", None, "got 'high=99999999999'"),
        (None, "priority_classes: {high: soon}\n", r"config.yaml: priority_classes: must be a mapping of "
         r"WorkloadPriorityClass names to integers"),
        (None, "priority_classes: [high]\n", "priority_classes: must be a mapping"),
    ],
)
def test_priority_class_definitions_that_are_not_names_and_integers_are_refused(settings, env, config, message):
    settings("TRAINJOB_PRIORITY_CLASSES", env, config)
    with pytest.raises(ValidationError, match=message):
        job_priority(job({"kueue.x-k8s.io/priority-class": "high"}))


def test_the_queue_name_is_the_kueue_label():
    assert queue_name(job({"kueue.x-k8s.io/queue-name": "team-a"})) == "team-a"
    assert queue_name(job()) is None


def test_priority_says_where_it_came_from():
    assert Priority(1000, "kueue.x-k8s.io/priority-class high").describe() == \
        "priority 1000 (kueue.x-k8s.io/priority-class high)"
    assert Priority().describe() == "priority 0"
