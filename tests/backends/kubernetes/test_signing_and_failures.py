"""Runtime-snapshot signatures and failure root causes: pure functions, no cluster."""

from __future__ import annotations

import json
from typing import Any

import pytest

from trainjob.backends.kubernetes.resources import RUNTIME_SNAPSHOT_ANNOTATION
from trainjob.backends.kubernetes.rootcause import exception_line, failed_rank, root_cause
from trainjob.backends.kubernetes.snapshot import SIGNATURE_ANNOTATION, SnapshotSigner

SNAPSHOT = {"kind": "ClusterTrainingRuntime", "name": "torch-distributed", "spec": {"mlPolicy": {}}}


def job(uid: str = "u-1", name: str = "mnist", annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ml", "uid": uid, "annotations": annotations or {}}}


def test_a_snapshot_the_operator_signed_verifies() -> None:
    signer = SnapshotSigner(b"k" * 32)
    signed = job(annotations=signer.annotations(job(), SNAPSHOT))
    assert signer.verified(signed) == SNAPSHOT


@pytest.mark.parametrize(
    "annotations",
    [
        {RUNTIME_SNAPSHOT_ANNOTATION: json.dumps(SNAPSHOT)},  # written by a user, unsigned
        {RUNTIME_SNAPSHOT_ANNOTATION: json.dumps(SNAPSHOT), SIGNATURE_ANNOTATION: "0" * 64},  # forged signature
        {RUNTIME_SNAPSHOT_ANNOTATION: "{not json", SIGNATURE_ANNOTATION: "x"},  # garbage
        {},
    ],
    ids=["unsigned", "forged", "garbage", "absent"],
)
def test_a_snapshot_the_operator_did_not_sign_is_ignored(annotations: dict[str, str]) -> None:
    assert SnapshotSigner(b"k" * 32).verified(job(annotations=annotations)) is None


def test_a_signed_snapshot_copied_to_another_job_or_edited_is_ignored() -> None:
    signer = SnapshotSigner(b"k" * 32)
    copied = signer.annotations(job(uid="other-job"), SNAPSHOT)
    assert signer.verified(job(annotations=copied)) is None
    edited = signer.annotations(job(), SNAPSHOT)
    edited[RUNTIME_SNAPSHOT_ANNOTATION] = edited[RUNTIME_SNAPSHOT_ANNOTATION].replace("torch-distributed", "evil")
    assert signer.verified(job(annotations=edited)) is None
    assert SnapshotSigner(b"q" * 32).verified(job(annotations=signer.annotations(job(), SNAPSHOT))) is None


TORCHRUN_TAIL = """\
[rank1]:   File "/work/train.py", line 49, in main
[rank1]:     print(lr)
[rank1]: NameError: name 'lr' is not defined
E1123 09:23:48.148000 2344 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1)
Traceback (most recent call last):
  File "/usr/bin/torchrun", line 6, in <module>
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
Root Cause (first observed failure):
[0]:
  time      : 2026-11-23_09:23:48
  rank      : 3 (local_rank: 1)
  exitcode  : 1 (pid: 2386)
============================================================
"""
PEER_TAIL = """\
[rank0]: RuntimeError: [gloo/transport/tcp/pair.cc:553] Connection closed by peer [10.0.0.7]:20112.
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
Root Cause (first observed failure):
  rank      : 0 (local_rank: 0)
"""


def test_exception_line_skips_torchruns_echo_and_lost_peers() -> None:
    assert exception_line(TORCHRUN_TAIL) == "NameError: name 'lr' is not defined"
    assert exception_line(PEER_TAIL) is None
    assert failed_rank(TORCHRUN_TAIL) == 3


def pod(index: int, message: str, finished: str, code: int = 1) -> dict[str, Any]:
    return {
        "metadata": {"name": f"mnist-node-0-{index}-x", "labels": {"batch.kubernetes.io/job-completion-index": str(index)}},
        "status": {
            "containerStatuses": [
                {"name": "node", "state": {"terminated": {"exitCode": code, "message": message, "finishedAt": finished}}}
            ]
        },
    }


def test_root_cause_names_the_rank_that_raised_not_the_peer_it_took_down() -> None:
    pods = [pod(0, PEER_TAIL, "2026-11-23T09:23:47Z"), pod(1, TORCHRUN_TAIL, "2026-11-23T09:23:49Z")]
    assert root_cause(pods, lambda p, c: "") == "node-1 rank 3: NameError: name 'lr' is not defined"


def test_root_cause_reads_the_log_when_the_termination_message_lost_the_exception() -> None:
    pods = [pod(1, "teardown noise\n" * 80, "2026-11-23T09:23:49Z")]
    assert root_cause(pods, lambda p, c: TORCHRUN_TAIL) == "node-1 rank 3: NameError: name 'lr' is not defined"


def test_root_cause_falls_back_to_the_first_exit_code_and_signal() -> None:
    killed = pod(2, "", "2026-11-23T09:23:40Z", code=137)
    killed["status"]["containerStatuses"][0]["state"]["terminated"]["signal"] = 9
    assert root_cause([pod(0, PEER_TAIL, "2026-11-23T09:23:47Z"), killed], lambda p, c: "") == (
        "node-2: exited with code 137 (signal 9)"
    )
    assert root_cause([pod(0, "", "", code=0)], lambda p, c: "") is None


def test_root_cause_names_a_refused_initializer_by_its_step_and_its_reason() -> None:
    refused = pod(0, "DownloadError: s3://private/data (at http://10.0.0.5:9000): listing: 403 SignatureDoesNotMatch",
                  "2026-11-23T09:23:47Z", code=3)
    refused["metadata"]["labels"]["jobset.sigs.k8s.io/replicatedjob-name"] = "dataset-initializer"
    assert root_cause([refused], lambda p, c: "") == (
        "dataset-initializer: DownloadError: s3://private/data (at http://10.0.0.5:9000): listing: 403 "
        "SignatureDoesNotMatch")


def test_root_cause_puts_an_oom_killed_container_before_the_exceptions_it_caused() -> None:
    oom = pod(1, "torchrun: Signal 9 (SIGKILL) received", "2026-11-23T09:23:48Z", code=137)
    oom["status"]["containerStatuses"][0]["state"]["terminated"]["reason"] = "OOMKilled"
    oom["spec"] = {"nodeName": "worker-3", "containers": [{"name": "node", "resources": {"limits": {"memory": "512Mi"}}}]}
    peer = pod(0, TORCHRUN_TAIL, "2026-11-23T09:23:47Z")  # an exception, and even earlier
    assert root_cause([peer, oom], lambda p, c: "") == (
        "node-1: OOMKilled: container node on node worker-3 went over its memory limit of 512Mi (exit code 137)"
    )
