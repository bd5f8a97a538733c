"""The one-line root cause both backends put first in a failed job's message."""

from __future__ import annotations

import pytest

from trainjob.rootcause import MAX_EXCEPTION_CHARS, exception_line, first_line, root_cause_line


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("NameError: name 'lr' is not defined", "NameError: name 'lr' is not defined"),
        # torchrun's tee prefix and, after init_process_group, torch's own
        ("[rank1]: [rank1]: NameError: name 'lr' is not defined", "NameError: name 'lr' is not defined"),
        ("[default0]:torch.OutOfMemoryError: CUDA out of memory", "torch.OutOfMemoryError: CUDA out of memory"),
        # the last exception wins: the one the process died of comes last
        ("ValueError: first\nsome output\nKeyError: 'x'", "KeyError: 'x'"),
        # what only reports another rank's failure is no cause
        ("[rank0]: RuntimeError: [gloo] Connection closed by peer [127.0.0.1]:29500", None),
        ("torch.distributed.elastic.multiprocessing.errors.ChildFailedError:", None),
        ("torch.distributed.DistNetworkError: failed to recv", None),
        ("KeyError: 'x'\n[rank0]: RuntimeError: Connection reset by peer", "KeyError: 'x'"),
        # gloo's words for a peer that died, whatever socket error it names
        ("RuntimeError: [../gloo/transport/tcp/pair.cc:587] Read error [127.0.0.1]:411: EOF. This is typically "
         "caused by a remote worker crashing. Check the logs of the remote worker before reporting an error.", None),
        # a Ray node stopped after its driver failed: the cancelled call is the stop's echo, not the cause
        ("ValueError: the loss went to 42\nnode.py:720 -- Failed to mark the local node as draining on SIGTERM\n"
         "ray.exceptions.RpcError: RPC error: CANCELLED", "ValueError: the loss went to 42"),
        ("Traceback (most recent call last):\n  File \"x.py\", line 1", None),
        ("", None),
    ],
)
def test_exception_line_finds_the_root_exception(text, expected):
    assert exception_line(text) == expected


def test_long_messages_are_cut_and_multiline_ones_keep_their_first_line():
    assert len(exception_line("ValueError: " + "x" * 2000)) == MAX_EXCEPTION_CHARS
    assert first_line("\nRuntimeError: Error(s) in loading state_dict:\n\tMissing key(s)") == (
        "RuntimeError: Error(s) in loading state_dict:"
    )


def test_the_root_cause_line_names_node_rank_and_exception():
    assert root_cause_line("node-1", 1, "NameError: x") == "node-1 rank 1: NameError: x"
    assert root_cause_line("node-2", None, "NameError: x") == "node-2: NameError: x"
