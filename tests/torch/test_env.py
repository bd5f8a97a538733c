"""init/shutdown, rank-0 printing and logging, and seeding, in the test process."""

import logging
import random

import pytest
import torch

import trainjob.torch as tt
from trainjob.errors import ValidationError
from trainjob.torch.seed import rank_seed


def test_without_torchrun_the_script_is_a_job_of_one_process(single_process):
    ctx = single_process
    assert (ctx.rank, ctx.local_rank, ctx.world_size, ctx.local_world_size) == (0, 0, 1, 1)
    assert ctx.is_main
    assert ctx.backend == "gloo" and ctx.device == torch.device("cpu")
    assert tt.init() is ctx, "init() is idempotent"
    assert torch.distributed.get_world_size() == 1


def test_shutdown_is_safe_twice_and_without_init():
    tt.shutdown()
    tt.shutdown()
    assert not torch.distributed.is_initialized()


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"WORLD_SIZE": "2", "RANK": "x"}, r"RANK: must be an integer, got 'x'"),
        ({"WORLD_SIZE": "2", "RANK": "2"}, r"RANK: must be < WORLD_SIZE \(2\), got 2"),
        ({"WORLD_SIZE": "2"}, r"RANK: environment variable is required when WORLD_SIZE is set"),
        ({"LOCAL_RANK": "-1"}, r"LOCAL_RANK: must be >= 0, got -1"),
    ],
)
def test_a_broken_torchrun_environment_names_the_variable(monkeypatch, env, message):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError, match=message):
        tt.init()
    assert not torch.distributed.is_initialized()


@pytest.mark.parametrize(("rank", "printed"), [("0", "hello\n"), ("1", "")])
def test_print0_prints_on_rank_0_only(monkeypatch, capsys, rank, printed):
    monkeypatch.setenv("RANK", rank)
    tt.print0("hello")
    assert capsys.readouterr().out == printed


def test_the_logger_drops_records_on_other_ranks(monkeypatch):
    logger = tt.get_logger("trainjob.test_env")
    assert tt.get_logger("trainjob.test_env") is logger and len(logger.handlers) == 1
    records = []
    sink = logging.Handler()
    sink.emit = records.append
    logger.addHandler(sink)
    try:
        for rank in ("0", "1"):
            monkeypatch.setenv("RANK", rank)
            logger.info("from rank %s", rank)
    finally:
        logger.removeHandler(sink)
    assert [r.getMessage() for r in records] == ["from rank 0"]


def _seeded_on(rank: int, monkeypatch) -> tuple[torch.Tensor, float, torch.Tensor]:
    monkeypatch.setenv("RANK", str(rank))
    generator = tt.seed_everything(42)
    weights = torch.nn.Linear(4, 4).weight.detach().clone()
    return weights, random.random(), torch.rand(3, generator=generator)


def test_seed_everything_gives_every_rank_the_same_weights_and_its_own_augmentation(monkeypatch):
    weights0, py0, aug0 = _seeded_on(0, monkeypatch)
    weights1, py1, aug1 = _seeded_on(1, monkeypatch)
    again0 = _seeded_on(0, monkeypatch)
    assert torch.equal(weights0, weights1)
    assert py0 != py1 and not torch.equal(aug0, aug1)
    assert py0 == again0[1] and torch.equal(aug0, again0[2])
    assert len({rank_seed(42, r) for r in range(1000)} | {rank_seed(43, r) for r in range(1000)}) == 2000


def test_the_public_api_loads_without_pipelining_or_the_parallel_package(subprocesses):
    import subprocess
    import sys

    code = (
        "import sys, trainjob.torch as tt\n"
        "assert 'torch' not in sys.modules, 'import trainjob.torch alone should not import torch yet'\n"
        "[getattr(tt, name) for name in tt.__all__]\n"
        "print(sorted(m for m in sys.modules if 'pipelining' in m or m.startswith('trainjob.torch.parallel')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


GROUP_IN_A_CYCLE = '''
import gc
import sys
import torch
import trainjob.torch as tt

gc.disable()  # no collection on the way: only an explicit one, or the interpreter's last

class Holder:
    """A model's hooks refer back to it: a cycle only a collection frees, holding the process group."""
    def __init__(self, rank):
        self.rank = rank
        self.model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
        self.self = self
    def __del__(self):
        print(f"rank {self.rank} collected while finalizing: {sys.is_finalizing()}", flush=True)

holder = Holder(tt.init().rank)
holder.model(torch.ones(3, 4)).sum().backward()
del holder
tt.shutdown()
'''


def test_a_destroyed_group_a_model_still_holds_is_freed_before_the_interpreter_finalizes(torchrun, tmp_path):
    """gloo's workers drop their last collectives' tensors under the GIL; while Python finalizes they cannot, and the
    process aborts after a successful run. The group must be freed (its workers joined) before that."""
    script = tmp_path / "cycle.py"
    script.write_text(GROUP_IN_A_CYCLE)
    proc = torchrun(script)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(line for line in proc.stdout.splitlines() if "collected" in line) == [
        "rank 0 collected while finalizing: False",
        "rank 1 collected while finalizing: False",
    ], proc.stdout
