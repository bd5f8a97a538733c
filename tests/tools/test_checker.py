"""Each rule of ``trainjob check``: one script that triggers it, one that does not."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from trainjob.errors import ValidationError
from trainjob.tools.check_rules import RULES
from trainjob.tools.checker import check_file, check_source

DIST = "import os\nimport torch\nimport torch.distributed as dist\ndist.init_process_group('gloo')\n"

# rule id -> (script that triggers it, line of the finding, script that does not)
CASES: dict[str, tuple[str, int, str]] = {
    "TJ001": (
        "sampler = DistributedSampler(data)\nfor epoch in range(3):\n    train(sampler)\n",
        1,
        "sampler = DistributedSampler(data)\nfor epoch in range(3):\n    sampler.set_epoch(epoch)\n",
    ),
    "TJ002": (
        "loader = DataLoader(data, shuffle=True, sampler=DistributedSampler(data))\n",
        1,
        "loader = DataLoader(data, sampler=DistributedSampler(data, shuffle=True))\n",
    ),
    "TJ003": (
        DIST + "loader = DataLoader(data, batch_size=32, shuffle=True)\n",
        5,
        DIST + "loader = tt.prepare_data_loader(DataLoader(data, batch_size=32, shuffle=True))\n",
    ),
    "TJ004": (
        DIST + "torch.save(model.state_dict(), 'model.pt')\n",
        5,
        DIST + "if dist.get_rank() == 0:\n    torch.save(model.state_dict(), 'model.pt')\n",
    ),
    "TJ005": (
        DIST + "for step in range(10):\n    print(f'loss {loss}')\n",
        6,
        DIST + "def log(msg):\n    if dist.get_rank() != 0:\n        return\n    print(msg)\n"
        "print(f'rank {dist.get_rank()} ready')\n",
    ),
    "TJ006": (
        DIST,
        4,
        DIST + "try:\n    train()\nfinally:\n    dist.destroy_process_group()\n",
    ),
    "TJ007": (
        "import torch.distributed as dist\ndist.init_process_group(backend='nccl')\n",
        2,
        "import torch\nimport torch.distributed as dist\n"
        "dist.init_process_group(backend='nccl' if torch.cuda.is_available() else 'gloo')\n",
    ),
    "TJ008": (
        DIST + "model = Net().cuda()\n",
        5,
        DIST
        + "local_rank = int(os.environ['LOCAL_RANK'])\ntorch.cuda.set_device(local_rank)\nmodel = Net().cuda()\n",
    ),
    "TJ009": (
        DIST + "model = Net()\nmodel = DDP(model)\nmodel.to(device)\n",
        6,
        DIST + "model = Net()\nmodel.to(device)\nmodel = DDP(model, device_ids=[local_rank])\n",
    ),
    "TJ010": (
        DIST + "model = Net()\n",
        1,
        DIST + "torch.manual_seed(42 + dist.get_rank())\nmodel = Net()\n",
    ),
    "TJ011": (
        "for x, y in loader:\n    loss = model(x)\n    loss.backward()\n    total += loss.item()\n",
        4,
        "for step, (x, y) in enumerate(loader):\n    loss = model(x)\n    loss.backward()\n"
        "    if step % 100 == 0:\n        print(loss.item())\n",
    ),
    "TJ012": (
        DIST + "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)\n",
        5,
        DIST + "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4 * dist.get_world_size())\n",
    ),
    "TJ013": (
        DIST + "model = DDP(nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8)).to(device))\n",
        5,
        DIST + "net = nn.SyncBatchNorm.convert_sync_batchnorm(nn.Sequential(nn.BatchNorm2d(8)))\n"
        "model = DDP(net.to(device))\n",
    ),
    "TJ014": (
        DIST + "rank = dist.get_rank()\ntorch.cuda.set_device(rank)\n",
        6,
        DIST + "local_rank = int(os.environ['LOCAL_RANK'])\ntorch.cuda.set_device(local_rank)\n",
    ),
}


def test_every_rule_has_a_case() -> None:
    assert sorted(CASES) == [rule.id for rule in RULES]


@pytest.mark.parametrize("rule", sorted(CASES))
def test_rule_triggers_on_the_mistake(rule: str) -> None:
    bad, line, _ = CASES[rule]
    found = [f for f in check_source(bad, "train.py") if f.rule == rule]
    assert [f.line for f in found] == [line]
    assert found[0].fix


@pytest.mark.parametrize("rule", sorted(CASES))
def test_rule_stays_quiet_on_the_fixed_script(rule: str) -> None:
    _, _, good = CASES[rule]
    assert [f.rule for f in check_source(good, "train.py") if f.rule == rule] == []


SEED_000_SCRIPT = textwrap.dedent(
    """
    import os
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler

    def main():
        device = "cuda" if torch.cuda.is_available() else "cpu"
        backend = "nccl" if device == "cuda" else "gloo"
        dist.init_process_group(backend=backend)
        rank = dist.get_rank()
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        model = Net().to(device)
        model = DDP(model, device_ids=[local_rank] if device == "cuda" else None)
        sampler = DistributedSampler(dataset)
        dataloader = DataLoader(dataset, batch_size=64, sampler=sampler)
        optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
        for epoch in range(10):
            sampler.set_epoch(epoch)
            for batch_idx, (data, target) in enumerate(dataloader):
                optimizer.zero_grad()
                loss = criterion(model(data.to(device)), target.to(device))
                loss.backward()
                optimizer.step()
                if batch_idx % 100 == 0 and rank == 0:
                    print(f"Epoch {epoch} Loss: {loss.item():.6f}")
            if rank == 0:
                torch.save(model.module.state_dict(), "model.pt")
        dist.destroy_process_group()
    """
)


def test_the_seeds_correct_ddp_script_is_clean() -> None:
    assert check_source(SEED_000_SCRIPT, "train.py") == []


@pytest.mark.parametrize(
    ("script", "rule"),
    [
        # an evaluation sampler without shuffling has no order to change between epochs
        ("evaluation = DistributedSampler(test_data, shuffle=False)\n", "TJ001"),
        # torch.save in a helper that is only called on rank 0
        (
            DIST
            + "def save_checkpoint(m):\n    torch.save(m, 'a.pt')\nif dist.get_rank() == 0:\n    save_checkpoint(model)\n",
            "TJ004",
        ),
        # averaging gradients by hand is the training step, not a metric read every step
        (
            "for x in loader:\n    model(x).backward()\n    for p in model.parameters():\n        dist.all_reduce(p.grad)\n",
            "TJ011",
        ),
    ],
)
def test_patterns_that_look_like_mistakes_but_are_not(script: str, rule: str) -> None:
    assert [f.rule for f in check_source(script) if f.rule == rule] == []


def test_helper_called_on_every_rank_is_not_guarded() -> None:
    script = DIST + "def save_checkpoint(m):\n    torch.save(m, 'a.pt')\nsave_checkpoint(model)\n"
    assert [f.line for f in check_source(script) if f.rule == "TJ004"] == [6]


def test_ignore_comment_and_ignore_argument_drop_findings() -> None:
    script = (
        DIST + "torch.manual_seed(0)\ndist.destroy_process_group()\nprint('x')  # trainjob: ignore[TJ005]\n"
    )
    assert check_source(script) == []
    assert [f.rule for f in check_source(script.replace("  # trainjob: ignore[TJ005]", ""))] == ["TJ005"]
    assert check_source(script.replace("  # trainjob: ignore[TJ005]", ""), ignore=frozenset({"TJ005"})) == []


def test_findings_are_ordered_errors_first() -> None:
    findings = check_source(DIST + "torch.save(m, 'a.pt')\n")
    assert [f.severity for f in findings] == sorted(
        (f.severity for f in findings), key=["error", "warning", "hint"].index
    )
    assert findings[0].rule == "TJ004"


def test_syntax_error_names_the_file_and_line(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("import torch\nfor x in :\n")
    with pytest.raises(ValidationError) as caught:
        check_file(script)
    assert caught.value.path == str(script)
    assert caught.value.message.startswith("line 2: cannot parse the script")


def test_missing_file_is_bad_input(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="cannot read the script"):
        check_file(tmp_path / "missing.py")


EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize("example", sorted(p.name for p in EXAMPLES.glob("*.py")))
def test_the_examples_are_clean(example: str) -> None:
    assert [f.render() for f in check_file(EXAMPLES / example)] == []


@pytest.mark.parametrize(
    "script",
    [
        # DDP broadcasts rank 0's parameters when it wraps the model: the ranks agree without a seed
        DIST + "model = DDP(Net())\n",
        DIST + "from torch.nn.parallel import DistributedDataParallel\nmodel = DistributedDataParallel(Net())\n",
        "import trainjob.torch as tt\nctx = tt.init()\nmodel = tt.prepare_model(Net())\n",
        "import trainjob.torch as tt\nctx = tt.init()\nmodel = tt.prepare_model(Net(), 'ddp')\n",
        DIST + "model = FSDP(Net(), sync_module_states=True)\n",
        # seeded through trainjob.torch, under another name, or in a helper of the script's own
        "import trainjob.torch as tt\nctx = tt.init()\ntt.seed_everything(0)\nmodel = tt.prepare_model(Net(), 'fsdp')\n",
        DIST + "from trainjob.torch import seed_everything as init_rng\ninit_rng(0)\nmodel = Net()\n",
        DIST + "def setup(seed):\n    torch.manual_seed(seed)\nsetup(0)\nmodel = Net()\n",
        DIST + "from common import seed_all\nseed_all(1234)\nmodel = Net()\n",
        DIST + "import random\ntorch.random.manual_seed(0)\nmodel = Net()\n",
    ],
)
def test_no_seed_stays_quiet_on_correct_scripts(script: str) -> None:
    assert [f.rule for f in check_source(script) if f.rule == "TJ010"] == []


@pytest.mark.parametrize(
    "script",
    [
        DIST + "model = Net()\n",  # nothing makes the ranks' weights agree
        "import trainjob.torch as tt\nctx = tt.init()\nmodel = tt.prepare_model(Net(), 'fsdp')\n",  # no broadcast
        DIST + "from torch.distributed.fsdp import fully_shard\nmodel = fully_shard(Net())\n",
        DIST + "seed = tt.rank_seed(0)\nmodel = Net()\n",  # derives a number, seeds nothing
    ],
)
def test_no_seed_still_warns_when_nothing_makes_the_weights_agree(script: str) -> None:
    assert [f.rule for f in check_source(script) if f.rule == "TJ010"] == ["TJ010"]


def test_a_seed_set_in_a_helper_module_beside_the_script_counts(tmp_path: Path) -> None:
    (tmp_path / "helpers.py").write_text("import torch\n\ndef setup(seed):\n    torch.manual_seed(seed)\n")
    script = tmp_path / "train.py"
    script.write_text(DIST + "from helpers import setup\nsetup(0)\nmodel = Net()\n")
    assert [f.rule for f in check_file(script) if f.rule == "TJ010"] == []
    (tmp_path / "helpers.py").write_text("def setup(seed):\n    print(seed)\n")
    assert [f.rule for f in check_file(script) if f.rule == "TJ010"] == ["TJ010"]
