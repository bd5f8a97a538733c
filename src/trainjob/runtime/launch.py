"""The torch launch contract: the launch values a resolved job runs with (:class:`LaunchValues`, the same for every
backend), where a backend's nodes meet (:class:`Addressing`), and the one function that turns both into torchrun's
``PET_*`` environment (:func:`torchrun_env`). This module holds the ``PET_*`` table; the torch plugin, the local
backend and the docs link here.

A :class:`~trainjob.runtime.plan.Plan` holds everything a backend needs; of it, :func:`resolve_launch_values` keeps the
numbers that decide how many processes start where: nodes, processes per node, the rendezvous port and, for an
elastic torch job, the node range and the restart budget. A backend records them once and every reader (``logs
--rank``, ``describe``, the stall watch) reads the resolved numbers back instead of resolving the spec again:

=================  =====================================================================================
backend            where the launch values are kept
=================  =====================================================================================
local              the job's row in the store holds the :class:`~trainjob.backends.local.process_specs.ProcessSpec`
                   its nodes start from, which carries them in its nodes' ``PET_*`` environment
Kubernetes         the annotation ``trainjob/launch`` (:data:`~trainjob.constants.LAUNCH_ANNOTATION`, JSON of
                   :meth:`LaunchValues.to_dict`) on the JobSet, and on the TrainJob when trainjob's client created it
=================  =====================================================================================

>>> values = LaunchValues(num_nodes=2, num_proc_per_node=4)
>>> values.to_dict()
{'numNodes': 2, 'numProcPerNode': 4, 'masterPort': 29500}
>>> values.node_of_rank(5)
1
>>> LaunchValues.from_dict(values.to_dict()) == values
True
>>> elastic = LaunchValues(num_nodes=4, num_proc_per_node=1, min_nodes=1, max_nodes=4, max_restarts=3)
>>> elastic.nnodes_arg()
'1:4'

The launch values come from the job (the torch plugin, :mod:`trainjob.runtime.plugins.torch`); each backend supplies
only the addressing. ``torchrun`` reads ``PET_<OPTION>`` as ``--<option>``:

=========================  ===========================================  ==========================================
variable                   Kubernetes (:func:`kubernetes_addressing`)   local node process
                                                                        (:mod:`trainjob.backends.local.process_specs`)
=========================  ===========================================  ==========================================
``PET_NNODES``             ``spec.trainer.numNodes``, else the          (the same)
                           runtime's ``mlPolicy.numNodes``, else 1;
                           elastic: ``minNodes:maxNodes``
                           (:meth:`LaunchValues.nnodes_arg`)
``PET_NPROC_PER_NODE``     ``numProcPerNode`` resolved (``auto``,       (the same)
                           ``cpu``, ``gpu``: the torch plugin's
                           ``resolve_num_proc_per_node``)
``PET_NODE_RANK``          the pod's completion index (``fieldRef``)    the node's index
``PET_MASTER_ADDR``        ``{job}-node-0-0.{job}``, the first          ``127.0.0.1``
                           trainer pod's DNS name
``PET_MASTER_PORT``        :attr:`LaunchValues.master_port` (29500,     a free port picked when the nodes start
                           also opened as a container port)
``PET_MAX_RESTARTS``       elastic: ``elasticPolicy.maxRestarts``       elastic: ``0``, the supervisor restarts the
                           (:attr:`LaunchValues.max_restarts`)          node group; shrinkable: ``maxRestarts``,
                                                                        how many lost nodes the ranks outlive
``PET_RDZV_BACKEND``       elastic: ``c10d``                            (the same)
``PET_RDZV_ENDPOINT``      elastic: ``{master addr}:{master port}``     ``127.0.0.1:{port}``; shrinkable: the
                                                                        rendezvous store the supervisor runs
``PET_RDZV_ID``            elastic: the job name                        (the same); shrinkable: ``{job}-{restart}``
``PET_RDZV_CONF``          elastic: ``last_call_timeout=5`` (torchrun   shrinkable: the supervisor's ``RDZV_CONF``
                           waits 30 s by default for late nodes)
``TORCH_DISABLE_SHARE_``   elastic: ``1``, so each rendezvous round's   (the same)
``RDZV_TCP_STORE``         ranks get a store of their own (a smaller
                           round would read the last one's addresses)
=========================  ===========================================  ==========================================

An elastic local job is *shrinkable* when ``minNodes < maxNodes`` and its command is ``torchrun``
(:mod:`trainjob.backends.local.process_specs`); its rendezvous is the supervisor's
(:mod:`trainjob.backends.local.supervisor.rendezvous`).

>>> env = torchrun_env(LaunchValues(2, 4), Addressing("127.0.0.1", node_rank=1, master_port=40123))
>>> {var.name: var.value for var in env}  # doctest: +NORMALIZE_WHITESPACE
{'PET_NNODES': '2', 'PET_NPROC_PER_NODE': '4', 'PET_NODE_RANK': '1', 'PET_MASTER_ADDR': '127.0.0.1',
 'PET_MASTER_PORT': '40123'}
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trainjob.constants import (
    COMPLETION_INDEX_FIELD_PATH,
    MASTER_PORT,
    PET_MASTER_ADDR,
    PET_MASTER_PORT,
    PET_MAX_RESTARTS,
    PET_NNODES,
    PET_NODE_RANK,
    PET_NPROC_PER_NODE,
    PET_RDZV_BACKEND,
    PET_RDZV_CONF,
    PET_RDZV_ENDPOINT,
    PET_RDZV_ID,
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE,
)
from trainjob.runtime.plan import EnvVar, Plan

__all__ = [
    "COMPLETION_INDEX",
    "Addressing",
    "FieldRef",
    "LaunchValues",
    "addressing_env",
    "kubernetes_addressing",
    "resolve_launch_values",
    "torchrun_env",
]

#: torchrun's rendezvous backend for elastic jobs.
RDZV_BACKEND = "c10d"
#: How long torchrun waits for late nodes once ``min_nodes`` have joined (its default is 30 s).
LAST_CALL_TIMEOUT_SECONDS = 5
DEFAULT_RDZV_CONF = f"last_call_timeout={LAST_CALL_TIMEOUT_SECONDS}"


@dataclass(frozen=True)
class LaunchValues:
    """The backend-neutral launch values a job resolves to.

    ``num_nodes`` is the number of nodes started: ``max_nodes`` for an elastic job (torchrun accepts any count
    from ``min_nodes`` up). ``min_nodes`` and ``max_nodes`` are both set (elastic) or both ``None``.

    >>> LaunchValues(num_nodes=2, num_proc_per_node=0)
    Traceback (most recent call last):
    ...
    ValueError: numProcPerNode must be a positive integer, got 0
    >>> LaunchValues(num_nodes=2, num_proc_per_node=1, min_nodes=1)
    Traceback (most recent call last):
    ...
    ValueError: elastic minNodes and maxNodes are set together, got minNodes=1, maxNodes=None
    """

    num_nodes: int
    num_proc_per_node: int
    master_port: int = MASTER_PORT
    min_nodes: int | None = None
    max_nodes: int | None = None
    max_restarts: int = 0

    def __post_init__(self) -> None:
        for key, value in (("numNodes", self.num_nodes), ("numProcPerNode", self.num_proc_per_node)):
            if not _is_int(value) or value < 1:
                raise ValueError(f"{key} must be a positive integer, got {value!r}")
        if not _is_int(self.master_port) or not 0 < self.master_port < 65536:
            raise ValueError(f"masterPort must be a port number (1..65535), got {self.master_port!r}")
        if (self.min_nodes is None) != (self.max_nodes is None):
            raise ValueError(
                "elastic minNodes and maxNodes are set together, "
                f"got minNodes={self.min_nodes!r}, maxNodes={self.max_nodes!r}"
            )
        lo, hi = self.min_nodes, self.max_nodes
        if lo is not None and not (_is_int(lo) and _is_int(hi) and 1 <= lo <= hi):  # type: ignore[operator]
            raise ValueError(f"elastic needs 1 <= minNodes <= maxNodes, got minNodes={lo!r}, maxNodes={hi!r}")
        if not _is_int(self.max_restarts) or self.max_restarts < 0:
            raise ValueError(f"maxRestarts must be a non-negative integer, got {self.max_restarts!r}")

    @property
    def elastic(self) -> bool:
        """Whether torchrun may run the job on fewer nodes than started (``min_nodes`` .. ``max_nodes``)."""
        return self.min_nodes is not None

    @property
    def world_size(self) -> int:
        """Processes when every started node runs: ``num_nodes * num_proc_per_node``.

        >>> LaunchValues(num_nodes=2, num_proc_per_node=4).world_size
        8
        """
        return self.num_nodes * self.num_proc_per_node

    def nnodes_arg(self) -> str:
        """torchrun's ``--nnodes`` (``PET_NNODES``): the node count, or ``min:max`` when elastic.

        >>> LaunchValues(num_nodes=2, num_proc_per_node=4).nnodes_arg()
        '2'
        """
        if self.elastic:
            return f"{self.min_nodes}:{self.max_nodes}"
        return str(self.num_nodes)

    def node_of_rank(self, rank: int) -> int:
        """The node (0-based) that runs global ``rank`` when every started node runs.

        >>> LaunchValues(num_nodes=2, num_proc_per_node=4).node_of_rank(3)
        0
        >>> LaunchValues(num_nodes=2, num_proc_per_node=4).node_of_rank(8)
        Traceback (most recent call last):
        ...
        ValueError: rank 8 is out of range: this job has ranks 0..7 (2 nodes x 4 processes)
        """
        if not _is_int(rank) or not 0 <= rank < self.world_size:
            raise ValueError(
                f"rank {rank!r} is out of range: this job has ranks 0..{self.world_size - 1} "
                f"({self.num_nodes} node{'s' if self.num_nodes != 1 else ''} x {self.num_proc_per_node} "
                f"process{'es' if self.num_proc_per_node != 1 else ''})"
            )
        return rank // self.num_proc_per_node

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (camelCase, as in the TrainJob spec); ``elastic`` only for an elastic job.

        >>> LaunchValues(num_nodes=4, num_proc_per_node=2, min_nodes=2, max_nodes=4).to_dict()["elastic"]
        {'minNodes': 2, 'maxNodes': 4, 'maxRestarts': 0}
        """
        out: dict[str, Any] = {
            "numNodes": self.num_nodes,
            "numProcPerNode": self.num_proc_per_node,
            "masterPort": self.master_port,
        }
        if self.elastic:
            out["elastic"] = {
                "minNodes": self.min_nodes,
                "maxNodes": self.max_nodes,
                "maxRestarts": self.max_restarts,
            }
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LaunchValues:
        """The launch values :meth:`to_dict` wrote; a :class:`ValueError` names a missing or bad key.

        ``masterPort`` may be missing (the default port then).

        >>> LaunchValues.from_dict({"numNodes": 2})
        Traceback (most recent call last):
        ...
        ValueError: launch values lack 'numProcPerNode' (have: numNodes)
        """
        if not isinstance(data, Mapping):
            raise ValueError(f"launch values must be a mapping, got {type(data).__name__}")
        for key in ("numNodes", "numProcPerNode"):
            if key not in data:
                raise ValueError(f"launch values lack {key!r} (have: {', '.join(map(str, data)) or 'nothing'})")
        elastic = data.get("elastic")
        min_nodes = max_nodes = None
        max_restarts = 0
        if elastic is not None:
            if not isinstance(elastic, Mapping):
                raise ValueError(f"launch values' 'elastic' must be a mapping, got {elastic!r}")
            for key in ("minNodes", "maxNodes"):
                if key not in elastic:
                    raise ValueError(f"launch values' 'elastic' lacks {key!r}")
            min_nodes, max_nodes = elastic["minNodes"], elastic["maxNodes"]
            max_restarts = elastic.get("maxRestarts", 0)
        return cls(
            num_nodes=data["numNodes"],
            num_proc_per_node=data["numProcPerNode"],
            master_port=data.get("masterPort", MASTER_PORT),
            min_nodes=min_nodes,
            max_nodes=max_nodes,
            max_restarts=max_restarts,
        )


def resolve_launch_values(plan: Plan) -> LaunchValues:
    """The launch values of a resolved ``plan`` (torch, mpi or plainml).

    MPI: nodes are the hostfile's hosts and processes per node its slots; plainml: one process per node.
    """
    elastic = plan.elastic
    return LaunchValues(
        num_nodes=plan.num_nodes,
        num_proc_per_node=plan.num_proc_per_node,
        master_port=plan.master_port,
        min_nodes=elastic.min_nodes if elastic else None,
        max_nodes=elastic.max_nodes if elastic else None,
        max_restarts=elastic.max_restarts if elastic else 0,
    )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class FieldRef:
    """A value Kubernetes fills in from the pod itself (the downward API), such as its completion index."""

    field_path: str

    def value_from(self) -> dict[str, Any]:
        return {"fieldRef": {"fieldPath": self.field_path}}


#: The pod's Indexed Job completion index: the node rank of a JobSet's trainer pod.
COMPLETION_INDEX = FieldRef(COMPLETION_INDEX_FIELD_PATH)


@dataclass(frozen=True)
class Addressing:
    """Where one backend's nodes meet: what a backend supplies to :func:`torchrun_env`, next to the launch values.

    ``node_rank`` is the node's rank as a literal (a local node's index) or as a :class:`FieldRef` (a pod's
    completion index); ``None`` leaves ``PET_NODE_RANK`` out. ``master_port`` defaults to the launch values' port,
    ``rdzv_endpoint`` to ``{master_addr}:{master_port}``, ``rdzv_conf`` to ``last_call_timeout=5``; ``rdzv_id``
    names the rendezvous of an elastic job (the job's name).
    """

    master_addr: str
    node_rank: int | FieldRef | None = None
    master_port: int | None = None
    rdzv_endpoint: str | None = None
    rdzv_id: str | None = None
    rdzv_conf: str | None = None


def kubernetes_addressing(plan: Plan) -> Addressing:
    """A JobSet pod's addressing: its completion index is the node rank, node 0's DNS name the master."""
    return Addressing(master_addr=plan.master_addr(), node_rank=COMPLETION_INDEX, rdzv_id=plan.job_name)


def torchrun_env(launch: LaunchValues, addressing: Addressing) -> list[EnvVar]:
    """Every ``PET_*`` variable of a torch node: the launch values, then where the nodes meet.

    >>> values = LaunchValues(4, 2, min_nodes=2, max_nodes=4, max_restarts=3)
    >>> [(v.name, v.value) for v in torchrun_env(values, Addressing("m", node_rank=0, rdzv_id="job"))][5:8]
    [('PET_MAX_RESTARTS', '3'), ('PET_RDZV_BACKEND', 'c10d'), ('PET_RDZV_ENDPOINT', 'm:29500')]
    """
    return [
        EnvVar(PET_NNODES, launch.nnodes_arg()),
        EnvVar(PET_NPROC_PER_NODE, str(launch.num_proc_per_node)),
        *addressing_env(
            addressing, master_port=launch.master_port, rendezvous=launch.elastic, max_restarts=launch.max_restarts
        ),
    ]


def addressing_env(
    addressing: Addressing, *, master_port: int = MASTER_PORT, rendezvous: bool = False, max_restarts: int = 0
) -> list[EnvVar]:
    """The ``PET_*`` variables :func:`torchrun_env` takes from ``addressing``: the node's rank, the master and, with
    ``rendezvous`` (an elastic job), the restart budget and the c10d rendezvous.

    A backend that starts the nodes with the launch values already in their env (the local backend stores them
    when the job is created and picks the port when the nodes start) calls this with its addressing.
    """
    port = addressing.master_port if addressing.master_port is not None else master_port
    env: list[EnvVar] = []
    if isinstance(addressing.node_rank, FieldRef):
        env.append(EnvVar(PET_NODE_RANK, value_from=addressing.node_rank.value_from()))
    elif addressing.node_rank is not None:
        env.append(EnvVar(PET_NODE_RANK, str(addressing.node_rank)))
    env += [EnvVar(PET_MASTER_ADDR, addressing.master_addr), EnvVar(PET_MASTER_PORT, str(port))]
    if rendezvous:
        if not addressing.rdzv_id:
            raise ValueError("an elastic job's addressing needs a rendezvous id (rdzv_id), got none")
        env += [
            EnvVar(PET_MAX_RESTARTS, str(max_restarts)),
            EnvVar(PET_RDZV_BACKEND, RDZV_BACKEND),
            EnvVar(PET_RDZV_ENDPOINT, addressing.rdzv_endpoint or f"{addressing.master_addr}:{port}"),
            EnvVar(PET_RDZV_ID, addressing.rdzv_id),
            EnvVar(PET_RDZV_CONF, addressing.rdzv_conf or DEFAULT_RDZV_CONF),
            EnvVar(TORCH_DISABLE_SHARE_RDZV_TCP_STORE, "1"),
        ]
    return env
