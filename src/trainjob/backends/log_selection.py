"""Which nodes' logs a ``--node`` / ``--rank`` selection reads, and which rank wrote a line, the same on every
backend.

Ranks are laid out node by node, as torchrun numbers them: node ``n`` runs global ranks
``n * procs .. n * procs + procs - 1``. A selection that can match nothing is an error that says why::

    select_nodes("mnist", num_nodes=2, num_proc_per_node=4, node=None, rank=5)   # [1]
    select_nodes("mnist", 2, 4, node=0, rank=5)   # ValidationError: rank 5 runs on node-1, not node-0 ...
    parse_line(1, "[rank3]: loss 0.4")            # LogLine(node=1, rank=3, text="loss 0.4")
"""

from __future__ import annotations

import re

from trainjob.errors import ValidationError
from trainjob.sdk.types import LogLine

_RANK_PREFIX = re.compile(r"^\[rank(\d+)\]: ?")


def parse_line(node: int, raw: str) -> LogLine:
    """A raw node-log line as a :class:`~trainjob.sdk.types.LogLine`, its rank taken from torchrun's ``[rank3]:``
    prefix when there is one."""
    match = _RANK_PREFIX.match(raw)
    if match:
        return LogLine(node=node, rank=int(match.group(1)), text=raw[match.end() :])
    return LogLine(node=node, rank=None, text=raw)


def node_of_rank(rank: int, num_proc_per_node: int) -> int:
    """The node that runs global ``rank`` when every node runs ``num_proc_per_node`` processes."""
    return rank // max(1, num_proc_per_node)


def select_nodes(
    name: str, num_nodes: int, num_proc_per_node: int | None, node: int | None, rank: int | None
) -> list[int]:
    """The nodes to read for ``node`` and/or ``rank``; ``ValidationError`` when they match no process."""
    if node is not None and not 0 <= node < num_nodes:
        raise ValidationError("node", f"must be 0..{num_nodes - 1} for TrainJob {name}, got {node}")
    if rank is None:
        return [node] if node is not None else list(range(num_nodes))
    if num_proc_per_node is None:  # not known (yet): the rank's lines are looked for on the chosen nodes
        return [node] if node is not None else list(range(num_nodes))
    world = num_nodes * num_proc_per_node
    if not 0 <= rank < world:
        raise ValidationError("rank", f"must be 0..{world - 1} for TrainJob {name}, got {rank}")
    runs_on = node_of_rank(rank, num_proc_per_node)
    if node is not None and node != runs_on:
        first = node * num_proc_per_node
        raise ValidationError(
            "rank",
            f"rank {rank} runs on node-{runs_on}, not node-{node} (TrainJob {name}: {num_nodes} node(s) x "
            f"{num_proc_per_node} process(es); node-{node} runs ranks {first}..{first + num_proc_per_node - 1}); "
            f"drop --node or use --node {runs_on}",
        )
    return [runs_on]
