"""The table of documented differences from Kubeflow Trainer, read the way the conformance tests read it (no
cluster needed): rows parse, a listed difference is explained, an unlisted one is not, and ``*`` is literal-safe."""

from __future__ import annotations

from kubetest.conformance import Difference, diff, documented, unexplained

SECTIONS = ("JobSets and PodGroups", "Status of a suspended job", "Status through a job's life")


def test_every_section_has_rows_with_a_reason() -> None:
    for section in SECTIONS:
        rows = documented(section)
        assert rows, section
        assert all(r.why and r.why != "?" for r in rows), section


def test_a_listed_difference_is_explained_and_counted() -> None:
    rows = documented("JobSets and PodGroups")
    path = "JobSet:spec.replicatedJobs[node].template.spec.template.spec.restartPolicy"
    listed = Difference("builtin-minimal", path, "OnFailure", "Never")
    assert unexplained([listed], rows) == []
    assert sum(r.seen for r in rows) == 1


def test_an_unlisted_difference_or_value_is_not_explained() -> None:
    rows = documented("JobSets and PodGroups")
    path = "JobSet:spec.replicatedJobs[node].template.spec.template.spec.restartPolicy"
    new_value = Difference("builtin-minimal", path, "OnFailure", "Always")
    new_field = Difference("builtin-minimal", "JobSet:spec.startupPolicy", "<absent>", {"startupPolicyOrder": "InOrder"})
    assert unexplained([new_value, new_field], rows) == [new_value, new_field]


def test_brackets_in_a_pattern_are_literal() -> None:
    rows = documented("JobSets and PodGroups")
    # `containers[*]` must not act as a character class: a container named `x` still matches the row.
    path = "JobSet:spec.replicatedJobs[launcher].template.spec.template.spec.containers[x].terminationMessagePolicy"
    assert unexplained([Difference("c", path, "<absent>", "FallbackToLogsOnError")], rows) == []


def test_diff_keys_named_lists_by_name() -> None:
    kubeflow = {"env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]}
    ours = {"env": [{"name": "B", "value": "2"}, {"name": "A", "value": "3"}]}
    assert diff("c", kubeflow, ours) == [Difference("c", "env[A].value", "1", "3")]
