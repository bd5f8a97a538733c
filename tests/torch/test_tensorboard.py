"""report() writes TensorBoard runs, one per job, when TRAINJOB_TENSORBOARD=1."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from jobtest.local import delete_all_jobs, trainjob_resource

from trainjob.backends.local.client.backend import LocalBackend, LocalProcessBackendConfig

pytest.importorskip("tensorboard")

TRAIN = textwrap.dedent("""
    import sys
    from trainjob.torch.metrics import report
    scale = float(sys.argv[1])
    for step in range(1, 6):
        report({"loss": scale / step, "throughput": 100.0 * step}, step=step, total_steps=5)
""")


def scalars(run_dir: Path, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(run_dir))
    accumulator.Reload()
    return [(event.step, round(event.value, 6)) for event in accumulator.Scalars(tag)]


def test_every_job_is_one_run_under_the_jobs_directory(local_jobs, trainjob_home: Path, tmp_path: Path):
    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer

    script = tmp_path / "train.py"
    script.write_text(TRAIN, encoding="utf-8")
    backend = LocalBackend(LocalProcessBackendConfig(home=trainjob_home))
    env = [{"name": "TRAINJOB_TENSORBOARD", "value": "1"}]
    try:
        for name, scale in (("run-a", "1"), ("run-b", "2")):
            backend.apply(trainjob_resource(name, ["python", str(script), scale], env=env))
        for name in ("run-a", "run-b"):
            assert backend.wait_for_job_status(name, timeout=120).status == "Complete"

        runs = EventMultiplexer().AddRunsFromDirectory(str(trainjob_home / "jobs")).Runs()  # what tensorboard --logdir sees
        assert sorted(runs) == ["run-a", "run-b"]
        assert scalars(trainjob_home / "jobs" / "run-b", "loss") == [(1, 2.0), (2, 1.0), (3, 0.666667), (4, 0.5), (5, 0.4)]
        assert scalars(trainjob_home / "jobs" / "run-a", "throughput")[-1] == (5, 500.0)
    finally:
        delete_all_jobs(backend)


def test_off_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from trainjob.torch.metrics import report

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("TRAINJOB_TENSORBOARD_DIR", str(tmp_path / "tb"))
    monkeypatch.delenv("TRAINJOB_TENSORBOARD", raising=False)
    report({"loss": 1.0}, step=1)
    assert not (tmp_path / "tb").exists()
