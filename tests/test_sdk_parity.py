"""The Kubeflow SDK's newer calls work as written: waiting honours polling_interval for callbacks, options and
container trainers shape the TrainJob, get_runtime_packages prints the environment, and progress reported with
update_trainjob_status reaches ``trainjob get`` / ``list`` and the job's ``status.trainerStatus``."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from jobtest.local import delete_all_jobs, processes_under, wait_until

from trainjob.backends.base import wait_for_status
from trainjob.backends.local.client.backend import LocalBackend, LocalProcessBackendConfig
from trainjob.cli.main import main
from trainjob.errors import NotFoundError, ValidationError
from trainjob.sdk import types
from trainjob.sdk.client import CustomTrainer, CustomTrainerContainer, TrainerClient
from trainjob.sdk.options import (
    ActiveDeadlineSeconds,
    Annotations,
    ContainerPatch,
    JobSetSpecPatch,
    JobSetTemplatePatch,
    JobSpecPatch,
    JobTemplatePatch,
    Labels,
    Name,
    PodSpecPatch,
    PodTemplatePatch,
    ReplicatedJobPatch,
    RuntimePatch,
    TrainerArgs,
    TrainerCommand,
    TrainingRuntimeSpecPatch,
)
from trainjob.sdk.trainers import sdk_trainjob


@pytest.fixture
def client(trainjob_home: Path) -> Iterator[TrainerClient]:
    yield TrainerClient(LocalProcessBackendConfig(home=trainjob_home))
    delete_all_jobs(LocalBackend(LocalProcessBackendConfig(home=trainjob_home)))
    assert processes_under(trainjob_home) == []


def job_at(status: str) -> types.TrainJob:
    return types.TrainJob(name="j", runtime=None, steps=[], num_nodes=1, creation_timestamp=None, status=status)


def test_callbacks_come_every_polling_interval_while_the_job_is_read_more_often():
    # Real clock (wait_for_status takes none): guards the callback interval, which is given in seconds.
    started, reads, seen = time.monotonic(), [], []

    def get_job(name: str) -> types.TrainJob:
        reads.append(1)
        return job_at("Complete" if time.monotonic() - started > 1.6 else "Running")

    job = wait_for_status(get_job, "j", {"Complete"}, timeout=30, polling_interval=0.5,
                          callbacks=[lambda j: seen.append(j.status)], check_interval=0.05)

    assert job.status == "Complete" and len(reads) > 15
    assert 4 <= len(seen) <= 6, seen  # at 0, 0.5, 1.0, 1.5 s and with the job the wait ends on
    assert seen[-1] == "Complete"


def test_a_local_wait_calls_back_at_the_interval_asked_for(local_jobs, client, tmp_path):
    """A case once seen: 81 callbacks in 16 s at polling_interval=5 (the store was read, and callbacks called,
    every 0.2 s)."""
    name = client.train(trainer=CustomTrainerContainer(image="local"), options=[
        TrainerCommand(["python", "-c", "import time; time.sleep(3)"])])
    seen: list[str] = []

    client.wait_for_job_status(name, timeout=120, polling_interval=5, callbacks=[lambda j: seen.append(j.status)])

    assert len(seen) <= 3 and seen[-1] == "Complete", seen


PATCH = {"template": {"spec": {"replicatedJobs": [{"name": "node", "template": {"spec": {"template": {"spec": {
    "nodeSelector": {"gpu": "a100"}, "containers": [{"name": "node", "env": [{"name": "MODE", "value": "fast"}]}],
}}}}}]}}}


def test_options_shape_the_trainjob_as_the_kubeflow_sdks_do():
    trainer = CustomTrainerContainer(image="ghcr.io/me/train:1", num_nodes=2, resources_per_node={"gpu": 1})
    typed_patch = TrainingRuntimeSpecPatch(template=JobSetTemplatePatch(spec=JobSetSpecPatch(replicated_jobs=[
        ReplicatedJobPatch(name="node", template=JobTemplatePatch(spec=JobSpecPatch(template=PodTemplatePatch(
            spec=PodSpecPatch(node_selector={"gpu": "a100"},
                              containers=[ContainerPatch(name="node", env=[{"name": "MODE", "value": "fast"}])]),
        )))),
    ])))

    job = sdk_trainjob(trainer, "torch-distributed", "j123", [
        Name("mnist"), Labels({"team": "cv"}), Annotations({"note": "x"}), TrainerCommand(["torchrun", "/app/t.py"]),
        TrainerArgs(["--epochs", "3"]), ActiveDeadlineSeconds(600), RuntimePatch(training_runtime_spec=typed_patch),
    ], backend=None)

    assert job["metadata"] == {"name": "mnist", "labels": {"team": "cv"}, "annotations": {"note": "x"}}
    assert job["spec"]["trainer"] == {
        "image": "ghcr.io/me/train:1", "numNodes": 2,
        "resourcesPerNode": {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}},
        "command": ["torchrun", "/app/t.py"], "args": ["--epochs", "3"],
    }
    assert job["spec"]["activeDeadlineSeconds"] == 600
    assert job["spec"]["runtimePatches"] == [
        {"manager": "trainer.kubeflow.org/kubeflow-sdk", "trainingRuntimeSpec": PATCH}
    ]


def a_function() -> None:
    print("hi")


@pytest.mark.parametrize(
    ("trainer", "options", "match"),
    [
        (CustomTrainer(func=a_function), [TrainerCommand(["x"])], "TrainerCommand can only be used with CustomTrainerContainer"),
        (CustomTrainer(func=a_function), ["Name('x')"], r"options\[0\]: must be an option"),
        (CustomTrainer(func=a_function), [Name("Not_A_Label")], "metadata.name"),
        # an image is not run here: a container trainer needs its command
        (CustomTrainerContainer(image="ghcr.io/me/train:1"), [], "spec.trainer.command: the local backend needs a command"),
        ("a string", [], "trainer: must be a CustomTrainer, a CustomTrainerContainer or a BuiltinTrainer"),
    ],
)
def test_options_and_trainers_that_cannot_run_are_refused_before_anything_starts(client, trainer, options, match):
    with pytest.raises(ValidationError, match=match):
        client.train(trainer=trainer, options=options)
    assert client.list_jobs() == []
    with pytest.raises(ValidationError, match="ActiveDeadlineSeconds.seconds: must be an integer >= 1"):
        ActiveDeadlineSeconds(0)


def test_a_container_trainer_runs_its_command_here_named_labelled_and_patched(local_jobs, client):
    name = client.train(
        trainer=CustomTrainerContainer(image="ghcr.io/me/train:1", env={"GREETING": "hi"}),
        options=[Name("container-job"), Labels({"team": "cv"}),
                 TrainerCommand(["python", "-c", "import os; print(os.environ['GREETING'], os.environ['MODE'])"]),
                 RuntimePatch(training_runtime_spec=PATCH)],
    )

    job = client.wait_for_job_status(name, timeout=120)
    assert (name, job.status, job.resource["metadata"]["labels"]) == ("container-job", "Complete", {"team": "cv"})
    assert list(client.get_job_logs(name)) == ["node-0 | hi fast"]  # the patch's env reached the process
    reasons = {e.reason: e.message for e in client.get_job_events(name)}
    assert "ghcr.io/me/train:1 is not used locally" in reasons["ImageNotUsed"]


def test_custom_trainer_image_is_the_trainers_image(local_jobs, client):
    name = client.train(trainer=CustomTrainer(func=a_function, image="ghcr.io/me/torch:2"))
    assert client.get_job(name).resource["spec"]["trainer"]["image"] == "ghcr.io/me/torch:2"
    assert client.wait_for_job_status(name, timeout=120).status == "Complete"


def test_runtime_packages_are_printed(subprocesses, client, capsys):
    client.get_runtime_packages(client.get_runtime("torch-distributed"))
    out = capsys.readouterr().out
    assert out.startswith("Python: 3.") and "torch " in out and "pydantic " in out
    with pytest.raises(NotFoundError):
        client.get_runtime_packages("no-such-runtime")


REPORTS_PROGRESS = """
import os, time
from trainjob import update_trainjob_status
update_trainjob_status(progress_percent=42, estimated_remaining_seconds=120, metrics={"loss": 0.5, "phase": "eval"})
flag = os.path.join(os.environ["TRAINJOB_JOB_DIR"], "go")
deadline = time.time() + 120
while not os.path.exists(flag) and time.time() < deadline:
    time.sleep(0.05)
"""


def test_progress_reported_in_the_job_reaches_get_list_and_the_trainer_status(local_jobs, client, tmp_path, capsys):
    script = tmp_path / "progress.py"
    script.write_text(REPORTS_PROGRESS)
    name = client.train(trainer=CustomTrainerContainer(image="local"),
                        options=[Name("reporting"), TrainerCommand(["python", str(script)])])

    job = wait_until(lambda: (j := client.get_job(name)).progress and j, timeout=120, what="the progress")

    assert (job.progress.percent, job.progress.eta_seconds, job.progress.metrics) == (42, 120, {"loss": 0.5})
    assert job.resource["status"]["trainerStatus"] | {"lastUpdatedTime": "t"} == {
        "progressPercentage": 42, "estimatedRemainingSeconds": 120, "metrics": [{"name": "loss", "value": "0.5"}],
        "lastUpdatedTime": "t",
    }
    capsys.readouterr()
    assert main(["get", name]) == 0
    assert "Progress:    42% loss=0.5 eta 2m0s" in capsys.readouterr().out
    assert main(["list"]) == 0
    assert "42% loss=0.5 eta 2m0s" in capsys.readouterr().out
    (client.backend.store.job_dir(name) / "go").touch()
    assert client.wait_for_job_status(name, timeout=120).status == "Complete"
