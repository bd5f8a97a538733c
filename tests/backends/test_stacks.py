"""Reading ranks' stack dumps (trainjob.backends.stacks): the thread that runs the script, and which ranks the
others wait for."""

from __future__ import annotations

import doctest
import faulthandler
import tempfile
import threading

import pytest

import trainjob.backends.stacks as stacks
from trainjob.backends.stacks import RankStacks, find_stuck_ranks, format_stacks, parse_dump

SITE = "/opt/venv/lib/python3.11/site-packages"
C10D = f"{SITE}/torch/distributed/distributed_c10d.py"


def dump(*frames: tuple[str, int, str], thread: str = "Current thread 0x00007f0000000001") -> str:
    """A faulthandler dump of one thread, ``frames`` innermost first, as ``(file, line, function)``."""
    lines = [f"{thread} (most recent call first):"]
    lines += [f'  File "{file}", line {line} in {function}' for file, line, function in frames]
    return "\n".join(lines) + "\n"


ALL_REDUCE = dump((C10D, 2810, "all_reduce"), (f"{SITE}/torch/distributed/c10d_logger.py", 81, "wrapper"),
                  ("/job/train.py", 40, "<module>"))
BARRIER = dump((C10D, 4100, "barrier"), (f"{SITE}/torch/distributed/c10d_logger.py", 81, "wrapper"),
               ("/job/train.py", 52, "<module>"))
DDP_BACKWARD = dump((f"{SITE}/torch/autograd/graph.py", 829, "_engine_run_backward"),
                    (f"{SITE}/torch/autograd/__init__.py", 353, "backward"), (f"{SITE}/torch/_tensor.py", 626, "backward"),
                    ("/job/train.py", 44, "<module>"))
IN_DATA_LOADER = dump(("/job/train.py", 21, "__getitem__"), (f"{SITE}/torch/utils/data/_utils/fetch.py", 54, "fetch"),
                      (f"{SITE}/torch/utils/data/dataloader.py", 733, "__next__"), ("/job/train.py", 38, "<module>"))
IN_QUEUE = dump(("/usr/lib/python3.11/threading.py", 324, "wait"), ("/usr/lib/python3.11/queue.py", 180, "get"),
                (f"{SITE}/torch/utils/data/dataloader.py", 1133, "_try_get_data"), ("/job/train.py", 38, "main"),
                ("/job/train.py", 60, "<module>"))


def test_docstring_examples() -> None:
    result = doctest.testmod(stacks)
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.parametrize(("dumps", "stuck", "summary"), [
    ([ALL_REDUCE, IN_DATA_LOADER], [1],
     "rank 1 is not in the all_reduce that rank 0 waits in: rank 1 is in __getitem__ (train.py:21)"),
    # DDP waits for its gradient all-reduce inside backward
    ([DDP_BACKWARD, DDP_BACKWARD, IN_QUEUE, DDP_BACKWARD], [2],
     "rank 2 is not in the backward that ranks 0, 1, 3 wait in: rank 2 is in wait (threading.py:324), called from "
     "main (train.py:38)"),
    ([ALL_REDUCE, IN_DATA_LOADER, ALL_REDUCE, IN_DATA_LOADER], [1, 3],
     "ranks 1, 3 are not in the all_reduce that ranks 0, 2 wait in: rank 1 is in __getitem__ (train.py:21); "
     "rank 3 is in __getitem__ (train.py:21)"),
    ([ALL_REDUCE, ALL_REDUCE, BARRIER], [2],
     "rank 2 is in another collective than the all_reduce that ranks 0, 1 wait in: rank 2 is in barrier: barrier "
     "(torch/distributed/distributed_c10d.py:4100), called from <module> (train.py:52)"),
    ([ALL_REDUCE, ALL_REDUCE], [],
     "every rank waits in all_reduce (all_reduce (torch/distributed/distributed_c10d.py:2810), called from <module> "
     "(train.py:40) on rank 0); none is missing from it, so the collective itself does not finish"),
    ([IN_DATA_LOADER, IN_QUEUE], [0, 1],
     "no rank is in a collective: rank 0 is in __getitem__ (train.py:21); rank 1 is in wait (threading.py:324), "
     "called from main (train.py:38)"),
])
def test_the_ranks_the_others_wait_for_are_named_with_their_frame(dumps, stuck, summary) -> None:
    found = find_stuck_ranks([RankStacks(rank, text) for rank, text in enumerate(dumps)])
    assert found.stuck == stuck
    assert found.summary == summary


def test_ranks_without_stacks_are_said_so() -> None:
    found = find_stuck_ranks([RankStacks(0, ALL_REDUCE, node=0, pid=10),
                              RankStacks(1, None, node=1, pid=11, problem="wrote no stacks within 3 s")])
    assert found.stuck == []
    assert found.summary.endswith("; no stacks from rank 1 (node-1, pid 11): wrote no stacks within 3 s")
    assert find_stuck_ranks([]).summary == "no rank's stacks could be read"


def test_the_script_thread_is_read_from_a_real_dump_with_other_threads() -> None:
    release = threading.Event()

    def helper_waits() -> None:
        release.wait(30)

    helper = threading.Thread(target=helper_waits, name="helper")
    helper.start()
    try:
        with tempfile.TemporaryFile("w+") as out:
            faulthandler.dump_traceback(out, all_threads=True)
            out.seek(0)
            text = out.read()
    finally:
        release.set()
        helper.join()
    threads = parse_dump(text)
    assert len(threads) >= 2 and sum(t.current for t in threads) == 1
    assert any(f.function == "helper_waits" for t in threads for f in t.frames)
    main = RankStacks(0, text).main_thread()
    assert main[0].function == "test_the_script_thread_is_read_from_a_real_dump_with_other_threads"
    assert any(f.function == "<module>" for f in main)


def test_format_stacks_puts_each_rank_under_its_title() -> None:
    text = format_stacks([RankStacks(1, IN_DATA_LOADER, node=1, pid=11), RankStacks(0, None, problem="gone")])
    assert text.splitlines()[0] == "--- rank 0 ---"
    assert text.splitlines()[1] == "(no stacks: gone)"
    assert "--- rank 1 (node-1, pid 11) ---\nCurrent thread 0x00007f0000000001" in text
