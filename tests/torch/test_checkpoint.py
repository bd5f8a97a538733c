"""Checkpointer in one process: layout, retention, what is restored, and how bad requests are refused."""

import json
import random

import pytest
import torch
from torch import nn

import trainjob.torch as tt
from trainjob.errors import NotFoundError, ValidationError


def _trained(seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(5, 3)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    return model, optimizer


def test_a_fresh_directory_resumes_at_step_zero_and_changes_nothing(single_process, tmp_path):
    model, optimizer = _trained(0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert tt.Checkpointer(tmp_path / "none").resume(model, optimizer) == 0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_load_restores_model_optimizer_step_extra_state_and_random_generators(single_process, tmp_path):
    model, optimizer = _trained(0)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    optimizer.step()
    scheduler.step()
    ckpt = tt.Checkpointer(tmp_path)
    path = ckpt.save(7, model, optimizer, scheduler=scheduler)
    expected_draws = (torch.rand(3), random.random())
    assert path == tmp_path / "step-00000007"
    assert json.loads((path / "trainjob.json").read_text())["step"] == 7

    other, other_optimizer = _trained(1)
    other_scheduler = torch.optim.lr_scheduler.StepLR(other_optimizer, step_size=1, gamma=0.5)
    assert ckpt.resume(other, other_optimizer, scheduler=other_scheduler) == 7
    for name, tensor in model.state_dict().items():
        assert torch.equal(other.state_dict()[name], tensor), name
    assert other_optimizer.state_dict()["state"][0]["exp_avg"].equal(optimizer.state_dict()["state"][0]["exp_avg"])
    assert other_scheduler.get_last_lr() == scheduler.get_last_lr()
    draws = (torch.rand(3), random.random())
    assert torch.equal(draws[0], expected_draws[0]) and draws[1] == expected_draws[1]


def test_keep_last_removes_the_oldest_checkpoints(single_process, tmp_path):
    model, optimizer = _trained(0)
    ckpt = tt.Checkpointer(tmp_path, keep_last=2)
    for step in (10, 20, 30, 40):
        ckpt.save(step, model, optimizer)
    assert ckpt.steps() == [30, 40]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000030", "step-00000040"]


def test_unfinished_directories_are_never_loaded(single_process, tmp_path):
    model, optimizer = _trained(0)
    ckpt = tt.Checkpointer(tmp_path)
    ckpt.save(5, model, optimizer)
    (tmp_path / ".partial-step-00000009").mkdir()  # what a crash during a save leaves
    (tmp_path / "step-00000008").mkdir()  # not committed: no trainjob.json
    assert ckpt.steps() == [5]
    assert ckpt.resume(*_trained(1)) == 5


def test_saving_the_same_step_again_replaces_it(single_process, tmp_path):
    ckpt = tt.Checkpointer(tmp_path)
    first, _ = _trained(0)
    second, _ = _trained(1)
    ckpt.save(3, first)
    ckpt.save(3, second)
    target, _ = _trained(2)
    ckpt.load(target)
    assert torch.equal(target[0].weight, second[0].weight)
    assert [p.name for p in tmp_path.iterdir()] == ["step-00000003"]


def test_async_save_is_committed_by_wait(single_process, tmp_path):
    model, optimizer = _trained(0)
    ckpt = tt.Checkpointer(tmp_path, async_save=True)
    ckpt.save(1, model, optimizer)
    ckpt.wait()
    assert ckpt.steps() == [1]
    target, target_optimizer = _trained(1)
    assert ckpt.load(target, target_optimizer) == 1
    assert torch.equal(target[2].bias, model[2].bias)


def test_loading_a_missing_step_names_the_steps_there_are(single_process, tmp_path):
    model, _ = _trained(0)
    ckpt = tt.Checkpointer(tmp_path)
    ckpt.save(4, model)
    with pytest.raises(NotFoundError, match=r"no checkpoint of step 9; committed steps: \[4\]"):
        ckpt.load(model, step=9)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda c, m: c.save(-1, m), r"step: must be an integer >= 0, got -1"),
        (lambda c, m: c.save(1, m, rng=torch.optim.SGD(m.parameters(), lr=1)), r"rng: is a reserved checkpoint key"),
        (lambda c, m: c.save(1, m, note="text"), r"note: needs state_dict\(\) and load_state_dict\(\), got str"),
    ],
    ids=["negative_step", "reserved_name", "not_stateful"],
)
def test_bad_save_requests_are_refused(single_process, tmp_path, call, message):
    model, _ = _trained(0)
    with pytest.raises(ValidationError, match=message):
        call(tt.Checkpointer(tmp_path), model)


@pytest.mark.parametrize("keep_last", [0, -1, 1.5, True])
def test_keep_last_must_be_a_positive_integer_or_none(tmp_path, keep_last):
    with pytest.raises(ValidationError, match="keep_last: must be an integer >= 1 or None"):
        tt.Checkpointer(tmp_path, keep_last=keep_last)
