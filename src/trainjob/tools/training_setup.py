"""What the planner needs to know about a training run, checked once.

>>> setup = TrainingSetup(params=7.5e9, gpus=8, nodes=8, zero=1)
>>> setup.world_size, setup.dp, setup.params_per_gpu
(64, 64, 7500000000)
>>> TrainingSetup(params=7e9, gpus=8, nodes=2, tp=3)
Traceback (most recent call last):
...
trainjob.errors.ValidationError: tp: tp × pp (3) must divide the world size gpus × nodes (16); try 1, 2, 4, 8 or 16

Ranks are laid out as :class:`trainjob.torch.parallel.ParallelDims` lays them out for training (one definition,
used by both): tensor-parallel ranks are neighbours (so a TP group stays inside a node whenever ``tp <= gpus``), then
pipeline stages, then data-parallel replicas outermost. ``dp = gpus × nodes / (tp × pp)``. On 2 nodes of 4 GPUs at
tp 2, pp 2, dp 2 the pipeline groups ([0, 2], [1, 3], ...) stay inside a node and the data-parallel groups
([0, 4], ...) cross nodes:

>>> setup = TrainingSetup(params=1e9, gpus=4, nodes=2, tp=2, pp=2)
>>> [(group, setup.group_spans_nodes(group)) for group in ("tp", "pp", "dp")]
[('tp', False), ('pp', False), ('dp', True)]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from trainjob.errors import ValidationError
from trainjob.torch.parallel.dims import ParallelDims

__all__ = ["DTYPES", "OPTIMIZERS", "PIPELINE_SCHEDULES", "ZERO_STAGES", "TrainingSetup"]

Dtype = Literal["bf16", "fp16", "fp32"]
Optimizer = Literal["adam", "adamw", "sgd"]

#: Bytes per value of each training dtype.
DTYPES: dict[str, int] = {"bf16": 2, "fp16": 2, "fp32": 4}
OPTIMIZERS = ("adam", "adamw", "sgd")
ZERO_STAGES = (0, 1, 2, 3)
#: Pipeline schedules the planner models, with the model stages each rank holds (see trainjob.torch.parallel).
PIPELINE_SCHEDULES: dict[str, int] = {"1F1B": 1, "GPipe": 1, "Interleaved1F1B": 2}


def _divisors(n: int) -> str:
    found = [str(d) for d in range(1, n + 1) if n % d == 0]
    return ", ".join(found[:-1]) + f" or {found[-1]}" if len(found) > 1 else found[0]


@dataclass(frozen=True)
class TrainingSetup:
    """A model, its parallel layout and its precision. Constructing one validates every field together.

    ``gpus`` is GPUs per node. ``params`` may be left out when ``layers`` and ``hidden`` are given: it is then
    ``12·layers·hidden² + vocab·hidden`` (a GPT block has 12h² weights). ``micro_batches`` is the number of
    micro-batches per optimizer step (gradient accumulation, or the pipeline's m); ``global_batch`` sets it to
    ``global_batch / (micro_batch × dp)`` instead.

    ``offload`` is DeepSpeed's ZeRO-Offload: optimizer states in host memory. ``cpu_offload`` is what
    ``parallelize(..., cpu_offload=True)`` does (FSDP2's ``CPUOffloadPolicy``): the shard's parameters, gradients and
    optimizer states all live in host memory and the GPU holds only the blocks being computed. ``schedule`` is the
    pipeline schedule (``1F1B``, ``GPipe`` or ``Interleaved1F1B`` with 2 stages per rank) when ``pp > 1``.
    ``sequence_parallel`` splits the layer norms' and dropouts' activations over the TP ranks along the sequence
    (Megatron-LM's ``--sequence-parallel``), so ``seq`` must divide by ``tp``.
    """

    params: int | float | None = None
    gpus: int = 1
    nodes: int = 1
    zero: int = 0
    tp: int = 1
    pp: int = 1
    dtype: Dtype = "bf16"
    optimizer: Optimizer = "adam"
    offload: bool = False
    layers: int | None = None
    hidden: int | None = None
    heads: int | None = None
    seq: int | None = None
    vocab: int | None = None
    micro_batch: int = 1
    micro_batches: int | None = None
    global_batch: int | None = None
    activation_checkpointing: bool = False
    flash_attention: bool = False
    schedule: str = "1F1B"
    cpu_offload: bool = False
    sequence_parallel: bool = False

    def __post_init__(self) -> None:
        errors = self._problems()
        if errors:
            raise ValidationError.combine(errors)
        if self.params is None:
            assert self.layers is not None and self.hidden is not None
            derived = 12 * self.layers * self.hidden**2 + (self.vocab or 0) * self.hidden
            object.__setattr__(self, "params", derived)
        object.__setattr__(self, "params", round(self.params))
        if self.micro_batches is None:
            per_step = self.global_batch // (self.micro_batch * self.dp) if self.global_batch else 1
            object.__setattr__(self, "micro_batches", per_step)

    def _problems(self) -> list[ValidationError]:
        errors: list[ValidationError] = []

        def fail(name: str, message: str) -> None:
            errors.append(ValidationError(name, message))

        for name in ("gpus", "nodes", "tp", "pp", "micro_batch"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                fail(name, f"must be an integer >= 1, got {getattr(self, name)!r}")
        for name in ("layers", "hidden", "heads", "seq", "vocab", "micro_batches", "global_batch"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                fail(name, f"must be an integer >= 1, got {value!r}")
        if self.params is not None and not self.params > 0:
            fail("params", f"must be > 0, got {self.params!r}")
        if self.params is None and (self.layers is None or self.hidden is None):
            fail("params", "give the parameter count, or layers and hidden to derive it from")
        if self.zero not in ZERO_STAGES:
            fail("zero", f"must be one of 0, 1, 2, 3, got {self.zero!r}")
        if self.dtype not in DTYPES:
            fail("dtype", f"must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.optimizer not in OPTIMIZERS:
            fail("optimizer", f"must be one of {', '.join(OPTIMIZERS)}, got {self.optimizer!r}")
        if self.offload and self.zero == 0:
            fail("offload", "needs zero >= 1 (optimizer states are offloaded per shard), got zero 0")
        if self.cpu_offload and self.zero == 0:
            fail("cpu_offload", "needs zero >= 1 (FSDP offloads its shards; DDP keeps full replicas), got zero 0")
        if self.cpu_offload and self.offload:
            fail("cpu_offload", "already offloads the optimizer states: give cpu_offload or offload, not both")
        if self.cpu_offload and (self.layers is None or self.hidden is None):
            fail("cpu_offload", "needs layers and hidden: the GPU holds the gathered blocks, whose size they give")
        if self.schedule not in PIPELINE_SCHEDULES:
            fail("schedule", f"must be one of {', '.join(PIPELINE_SCHEDULES)}, got {self.schedule!r}")
        if errors:
            return errors  # the checks below need valid degrees
        if self.world_size % (self.tp * self.pp):
            fail(
                "tp",
                f"tp × pp ({self.tp * self.pp}) must divide the world size gpus × nodes ({self.world_size}); "
                f"try {_divisors(self.world_size)}",
            )
            return errors
        stages = self.pp * self.stages_per_rank
        if self.layers is not None and self.layers % stages:
            per_rank = f" × {self.stages_per_rank} stages per rank ({self.schedule})" if self.stages_per_rank > 1 else ""
            fail(
                "layers",
                f"must be divisible by pp ({self.pp}){per_rank} so every stage gets whole layers, got {self.layers}",
            )
        if self.heads is not None and self.heads % self.tp:
            fail("heads", f"must be divisible by tp ({self.tp}), got {self.heads}")
        if self.sequence_parallel and self.seq is not None and self.seq % self.tp:
            fail("seq", f"must be divisible by tp ({self.tp}) with sequence parallelism, got {self.seq}")
        if self.heads is not None and self.hidden is not None and self.hidden % self.heads:
            fail("hidden", f"must be divisible by heads ({self.heads}), got {self.hidden}")
        if self.global_batch is not None:
            if self.micro_batches is not None:
                fail("global_batch", "give either micro_batches or global_batch, not both")
            elif self.global_batch % (self.micro_batch * self.dp):
                fail(
                    "global_batch",
                    f"must be a multiple of micro_batch × dp ({self.micro_batch * self.dp}), got {self.global_batch}",
                )
        return errors

    @property
    def stages_per_rank(self) -> int:
        """Model stages each pipeline rank holds: 2 for ``Interleaved1F1B``, else 1 (1 without pipelining)."""
        return PIPELINE_SCHEDULES.get(self.schedule, 1) if self.pp > 1 else 1

    @property
    def world_size(self) -> int:
        return self.gpus * self.nodes

    @property
    def dp(self) -> int:
        """Data-parallel degree: the ranks that hold the same model shard."""
        return self.world_size // (self.tp * self.pp)

    @property
    def params_per_gpu(self) -> int:
        """Parameters in one tensor-parallel × pipeline shard (before ZeRO shards it further)."""
        return round(self.params) // (self.tp * self.pp)  # type: ignore[arg-type]

    @property
    def value_bytes(self) -> int:
        """Bytes per weight, gradient and activation value in the training dtype."""
        return DTYPES[self.dtype]

    @property
    def has_shape(self) -> bool:
        """Whether layers, hidden, heads and seq are known, which activation and TP/PP estimates need."""
        return None not in (self.layers, self.hidden, self.heads, self.seq)

    def parallel_dims(self) -> ParallelDims:
        """The :class:`~trainjob.torch.parallel.ParallelDims` that trains this layout (data parallelism sharded)."""
        return ParallelDims(dp_shard=self.dp, tp=self.tp, pp=self.pp, world_size=self.world_size)

    def group_spans_nodes(self, group: Literal["tp", "dp", "pp"]) -> bool:
        """Whether a process group of this kind has members on more than one node, in the rank layout
        :class:`~trainjob.torch.parallel.ParallelDims` builds (TP innermost, then PP, DP outermost)."""
        return self.parallel_dims().spans_nodes(group, self.gpus)
