"""report(): rank 0 prints and appends the JSON-lines contract to $TRAINJOB_METRICS_FILE."""

import json
import math

import pytest
import torch

from trainjob.errors import ValidationError
from trainjob.torch.metrics import report


@pytest.fixture
def metrics_file(tmp_path, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    monkeypatch.setenv("TRAINJOB_METRICS_FILE", str(path))
    monkeypatch.setenv("RANK", "0")
    return path


def test_each_report_appends_one_json_object_per_line(metrics_file, capsys):
    report({"loss": torch.tensor(0.5), "lr": 1e-3}, step=10, total_steps=100)
    report({"loss": 0.25}, step=20, total_steps=100)
    records = [json.loads(line) for line in metrics_file.read_text().splitlines()]
    assert [(r["step"], r["total_steps"], r["metrics"]) for r in records] == [
        (10, 100, {"loss": 0.5, "lr": 1e-3}),
        (20, 100, {"loss": 0.25}),
    ]
    assert all(isinstance(r["time"], float) for r in records)
    assert capsys.readouterr().out.splitlines() == ["step 10/100 loss=0.5 lr=0.001", "step 20/100 loss=0.25"]


def test_step_and_total_are_optional(metrics_file):
    report({"accuracy": 0.9})
    assert json.loads(metrics_file.read_text()) | {"time": 0} == {
        "time": 0,
        "step": None,
        "total_steps": None,
        "metrics": {"accuracy": 0.9},
    }


def test_non_finite_values_are_written_as_null(metrics_file):
    report({"loss": math.nan, "scale": math.inf}, step=1)
    assert json.loads(metrics_file.read_text())["metrics"] == {"loss": None, "scale": None}


def test_other_ranks_write_nothing(metrics_file, monkeypatch, capsys):
    monkeypatch.setenv("RANK", "1")
    report({"loss": 1.0}, step=1)
    assert not metrics_file.exists()
    assert capsys.readouterr().out == ""


def test_without_the_variable_metrics_only_go_to_stdout(monkeypatch, capsys, tmp_path):
    monkeypatch.delenv("TRAINJOB_METRICS_FILE", raising=False)
    monkeypatch.setenv("RANK", "0")
    report({"loss": 2.0}, step=3)
    assert capsys.readouterr().out == "step 3 loss=2\n"
    assert not list(tmp_path.glob("**/*.jsonl"))


@pytest.mark.parametrize(
    ("metrics", "kwargs", "message"),
    [
        ({"loss": "low"}, {}, r"metrics.loss: must be a number or a one-element tensor, got 'low'"),
        ({"loss": torch.ones(2)}, {}, r"metrics.loss: .* got shape \(2,\)"),
        ({"loss": 1.0}, {"step": -1}, r"step: must be an integer >= 0 or None, got -1"),
        ({"loss": 1.0}, {"total_steps": 2.5}, r"total_steps: must be an integer >= 0 or None, got 2.5"),
    ],
)
def test_bad_values_are_refused_naming_the_field(metrics_file, metrics, kwargs, message):
    with pytest.raises(ValidationError, match=message):
        report(metrics, **kwargs)
