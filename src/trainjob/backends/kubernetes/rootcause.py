"""A failed TrainJob's root cause on Kubernetes, in one line: the failing node, rank and root exception.

When the JobSet fails, its condition only says that a Job failed. The operator then looks at the trainer pods
that failed, first failure first (the pods that died after it usually died *because* of it: a collective that lost
its peer), and reads the exception from the container's termination message (the trainer container has
``terminationMessagePolicy: FallbackToLogsOnError``, so the kubelet keeps the end of its log there), or else from
the end of its log::

    node-1 rank 1: NameError: name 'lr' is not defined

A container its cgroup killed for going over its memory limit says so before any exception (the ranks that lost
their peer raise afterwards)::

    node-1: OOMKilled: container node on node worker-3 went over its memory limit of 512Mi (exit code 137)

:mod:`trainjob.rootcause` holds what both backends share: the line's format
(:func:`~trainjob.rootcause.root_cause_line`) and :func:`~trainjob.rootcause.exception_line`, which finds the last
Python exception line in text; :func:`failed_rank` reads the rank from torchrun's "Root Cause" summary.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from trainjob.backends.kubernetes.resources import COMPLETION_INDEX_LABEL, REPLICATED_JOB_LABEL
from trainjob.constants import DATASET_INITIALIZER, MODEL_INITIALIZER
from trainjob.rootcause import exception_line, root_cause_line

__all__ = ["exception_line", "failed_rank", "root_cause"]

_ROOT_RANK = re.compile(r"Root Cause \(first observed failure\):.*?rank\s*:\s*(\d+)", re.S)


def failed_rank(text: str) -> int | None:
    """The global rank torchrun names as the root cause of its failure, if it printed its summary."""
    match = _ROOT_RANK.search(text)
    return int(match.group(1)) if match else None


def _terminated(pod: dict[str, Any]) -> dict[str, Any] | None:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        state = (status.get("state") or {}).get("terminated") or (status.get("lastState") or {}).get("terminated")
        if state and state.get("exitCode", 0) != 0:
            return {**state, "container": status["name"]}
    return None


def _oom_killed(pod: dict[str, Any], state: dict[str, Any]) -> str | None:
    """What the kubelet said of a container the kernel killed for its memory limit, or ``None``."""
    if state.get("reason") != "OOMKilled":
        return None
    container = state["container"]
    spec = next((c for c in pod["spec"].get("containers") or [] if c.get("name") == container), {})
    limit = ((spec.get("resources") or {}).get("limits") or {}).get("memory")
    over = f"went over its memory limit of {limit}" if limit else "ran out of memory (no memory limit)"
    node = pod["spec"].get("nodeName")
    return f"OOMKilled: container {container}{f' on node {node}' if node else ''} {over} (exit code {state.get('exitCode')})"


def root_cause(pods: list[dict[str, Any]], read_log: Callable[[dict[str, Any], str], str]) -> str | None:
    """``node-N rank R: Exception: message`` for the first trainer pod that failed, or ``None`` if none did.

    ``read_log(pod, container)`` returns the end of a container's log; it is asked only when the termination
    message holds no exception."""
    failed = [(pod, state) for pod in pods if (state := _terminated(pod)) is not None]
    if not failed:
        return None
    failed.sort(key=lambda item: (item[1].get("finishedAt") or "", item[0]["metadata"]["name"]))
    described = []
    for pod, state in failed:
        oom = _oom_killed(pod, state)
        if oom is not None:
            return root_cause_line(_node_of(pod), None, oom)
    for pod, state in failed:
        text = state.get("message") or ""
        line = exception_line(text)
        if line is None:
            try:
                text = read_log(pod, state["container"]) or text
            except Exception:  # logs can be gone with the node; the exit code still says something
                text = text or ""
            line = exception_line(text)
        rank = failed_rank(text)
        where = _node_of(pod)
        code = state.get("exitCode")
        signal = f" (signal {state['signal']})" if state.get("signal") else ""
        described.append((line is not None, root_cause_line(where, rank, line or f"exited with code {code}{signal}")))
    # The first failure that states an exception; else the first failure.
    return next((text for has_line, text in described if has_line), described[0][1])


def _node_of(pod: dict[str, Any]) -> str:
    """``node-N`` by the pod's completion index, else the pod's name; an initializer's pod is its step
    (``dataset-initializer``)."""
    labels = pod["metadata"].get("labels") or {}
    if labels.get(REPLICATED_JOB_LABEL) in (DATASET_INITIALIZER, MODEL_INITIALIZER):
        return labels[REPLICATED_JOB_LABEL]
    node = labels.get(COMPLETION_INDEX_LABEL) or (pod["metadata"].get("annotations") or {}).get(COMPLETION_INDEX_LABEL)
    return f"node-{node}" if node is not None else pod["metadata"]["name"]
