"""How many ways each kind of parallelism splits the world, and which ranks end up together.

The ranks are laid out DP-outermost, TP-innermost, the layout Megatron-style 3-D parallelism uses::

    rank = dp_rank * (pp * tp) + pp_rank * tp + tp_rank        dp_rank = dp_replicate_rank * dp_shard + dp_shard_rank

so the ``tp`` ranks of a tensor-parallel group are neighbours (one NVLink island on a GPU node), a pipeline group
takes every ``tp``-th rank inside one data-parallel replica, and a data-parallel group takes every ``pp * tp``-th
rank. For 8 ranks at ``tp=2, pp=2, dp=2``: TP groups [0, 1] [2, 3] [4, 5] [6, 7], PP groups [0, 2] [1, 3] [4, 6]
[5, 7], DP groups [0, 4] [1, 5] [2, 6] [3, 7]. ``print(dims.layout())`` shows this table for any setting::

    dims = ParallelDims(dp_shard=-1, tp=2, pp=2, world_size=8)   # dp_shard becomes 2
    mesh = dims.build_mesh("cpu")                                 # names: dp_replicate, dp_shard, pp, tp
    dims.dp_mesh(mesh), mesh["tp"], mesh["pp"]
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Literal

from trainjob.errors import ValidationError

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

__all__ = ["MESH_DIM_NAMES", "ParallelDims"]

MESH_DIM_NAMES = ("dp_replicate", "dp_shard", "pp", "tp")
"""Mesh dimension names, outermost first; every mesh has all four, unused ones with size 1."""

Dim = Literal["dp_replicate", "dp_shard", "dp", "pp", "tp"]


@dataclass
class ParallelDims:
    """Degrees of data (replicated and sharded), pipeline and tensor parallelism; one of them may be ``-1``.

    ``-1`` means "whatever is left of ``world_size``". The product must equal ``world_size``, which defaults to
    the size of the initialized process group (else ``$WORLD_SIZE``, else 1)::

        ParallelDims(dp_shard=-1, tp=2, world_size=8).dp_shard    # 4
        ParallelDims(tp=3, world_size=8)                          # ValidationError naming what to set
    """

    dp_replicate: int = 1
    dp_shard: int = -1
    tp: int = 1
    pp: int = 1
    world_size: int | None = None

    def __post_init__(self) -> None:
        if self.world_size is None:
            from trainjob.torch.env import global_world_size  # imports torch: only when the size is not given

            self.world_size = global_world_size()
        sizes = self._sizes()
        for name, size in sizes.items():
            if size == 0 or size < -1:
                raise ValidationError(f"parallel.{name}", f"must be >= 1 or -1 (the rest), got {size}")
        if self.world_size < 1:
            raise ValidationError("parallel.world_size", f"must be >= 1, got {self.world_size}")
        free = [name for name, size in sizes.items() if size == -1]
        if len(free) > 1:
            listed = ", ".join(free[:-1]) + f" and {free[-1]}"
            raise ValidationError(
                "parallel",
                f"only one size may be -1 (the rest), got -1 for {listed}; give the others a number",
            )
        fixed = math.prod(size for size in sizes.values() if size != -1)
        if free:
            if self.world_size % fixed:
                raise ValidationError(
                    f"parallel.{free[0]}",
                    f"cannot fill the rest: {self._product_text(sizes, skip=free[0])} = {fixed} does not divide "
                    f"world_size={self.world_size}",
                )
            setattr(self, free[0], self.world_size // fixed)
        elif fixed != self.world_size:
            hint = self._hint(sizes)
            raise ValidationError(
                "parallel",
                f"{self._product_text(sizes)} = {fixed} must equal world_size={self.world_size}; {hint}",
            )

    def _sizes(self) -> dict[str, int]:
        return {"dp_replicate": self.dp_replicate, "dp_shard": self.dp_shard, "tp": self.tp, "pp": self.pp}

    @staticmethod
    def _product_text(sizes: dict[str, int], skip: str | None = None) -> str:
        return " * ".join(f"{name}={size}" for name, size in sizes.items() if name != skip)

    def _hint(self, sizes: dict[str, int]) -> str:
        for name in ("dp_shard", "dp_replicate", "tp", "pp"):
            rest = math.prod(size for other, size in sizes.items() if other != name)
            if self.world_size % rest == 0:
                return f"set {name}={self.world_size // rest} (or {name}=-1)"
        return "choose sizes whose product is the world size, one of them may be -1"

    @property
    def dp(self) -> int:
        """All data-parallel ranks: ``dp_replicate * dp_shard``."""
        return self.dp_replicate * self.dp_shard

    def coordinates(self, rank: int) -> dict[str, int]:
        """``{"dp_replicate", "dp_shard", "dp", "pp", "tp"}`` coordinates of a global rank."""
        if not 0 <= rank < self.world_size:
            raise ValidationError("rank", f"must be in [0, {self.world_size}), got {rank}")
        tp_rank = rank % self.tp
        pp_rank = rank // self.tp % self.pp
        dp_rank = rank // (self.tp * self.pp)
        return {
            "dp_replicate": dp_rank // self.dp_shard,
            "dp_shard": dp_rank % self.dp_shard,
            "dp": dp_rank,
            "pp": pp_rank,
            "tp": tp_rank,
        }

    def groups(self, dim: Dim) -> list[list[int]]:
        """The rank groups of one dimension: ranks whose coordinates agree everywhere but along ``dim``."""
        if dim not in ("dp", *MESH_DIM_NAMES):
            raise ValidationError("dim", f"must be one of dp, {', '.join(MESH_DIM_NAMES)}, got {dim!r}")
        varying = {"dp": ("dp_replicate", "dp_shard")}.get(dim, (dim,))
        by_key: dict[tuple[int, ...], list[int]] = {}
        for rank in range(self.world_size):
            coords = self.coordinates(rank)
            key = tuple(coords[name] for name in MESH_DIM_NAMES if name not in varying)
            by_key.setdefault(key, []).append(rank)
        return list(by_key.values())

    def spans_nodes(self, dim: Dim, gpus_per_node: int) -> bool:
        """Whether a group of ``dim`` has ranks on more than one node, ``gpus_per_node`` consecutive ranks per node
        (torchrun's numbering: node ``n`` runs ranks ``n * gpus_per_node ...``)::

            ParallelDims(dp_shard=2, tp=2, pp=2, world_size=8).spans_nodes("dp", 4)   # True: DP groups [0, 4] ...
        """
        if gpus_per_node < 1:
            raise ValidationError("gpus_per_node", f"must be >= 1, got {gpus_per_node}")
        return _spans_nodes(self.dp_replicate, self.dp_shard, self.pp, self.tp, dim, gpus_per_node)

    def layout(self) -> str:
        """A printable description: the sizes, the rank formula, each dimension's groups and a rank table."""
        lines = [
            f"world_size={self.world_size}: tp={self.tp} x pp={self.pp} x dp={self.dp} "
            f"(dp_replicate={self.dp_replicate} x dp_shard={self.dp_shard})",
            "rank = dp_rank * (pp * tp) + pp_rank * tp + tp_rank  (TP innermost, DP outermost)",
        ]
        for dim in ("tp", "pp", "dp"):
            groups = " ".join(str(group) for group in self.groups(dim))
            lines.append(f"{dim.upper()} groups: {groups}")
        lines.append("rank  dp  pp  tp")
        for rank in range(self.world_size):
            c = self.coordinates(rank)
            lines.append(f"{rank:>4}  {c['dp']:>2}  {c['pp']:>2}  {c['tp']:>2}")
        return "\n".join(lines)

    def build_mesh(self, device_type: str) -> DeviceMesh:
        """One :class:`DeviceMesh` with dims ``dp_replicate, dp_shard, pp, tp`` over the default process group."""
        from torch.distributed.device_mesh import init_device_mesh

        return init_device_mesh(
            device_type,
            (self.dp_replicate, self.dp_shard, self.pp, self.tp),
            mesh_dim_names=MESH_DIM_NAMES,
        )

    def dp_mesh(self, mesh: DeviceMesh) -> DeviceMesh:
        """The 2-D ``(dp_replicate, dp_shard)`` sub-mesh FSDP shards and replicates over."""
        return mesh["dp_replicate", "dp_shard"]


@lru_cache(maxsize=4096)
def _spans_nodes(dp_replicate: int, dp_shard: int, pp: int, tp: int, dim: str, gpus_per_node: int) -> bool:
    dims = ParallelDims(dp_replicate=dp_replicate, dp_shard=dp_shard, pp=pp, tp=tp,
                        world_size=dp_replicate * dp_shard * pp * tp)  # fmt: skip
    return any(len({rank // gpus_per_node for rank in group}) > 1 for group in dims.groups(dim))  # type: ignore[arg-type]
