"""The mistakes ``trainjob check`` looks for, from the seeds' "correct / wrong" examples.

=====  ==============================  =======  ========================================================
id     name                            level    what
=====  ==============================  =======  ========================================================
TJ001  sampler-without-set-epoch       error    DistributedSampler without ``set_epoch``: same order every epoch
TJ002  shuffle-with-sampler            error    ``DataLoader(shuffle=True, sampler=...)``: PyTorch rejects it
TJ003  loader-without-sampler          warning  DataLoader without a sampler: every rank reads the same data
TJ004  unguarded-save                  error    ``torch.save`` on every rank: all write the same file
TJ005  unguarded-print                 warning  print / logging on every rank: N copies of each line
TJ006  missing-destroy-process-group   warning  ``init_process_group`` without ``destroy_process_group``
TJ007  hard-coded-backend              warning  ``"nccl"`` without a CUDA check, or ``"gloo"`` on GPUs
TJ008  cuda-without-local-rank         error    ``.cuda()`` / ``"cuda:0"`` and no LOCAL_RANK: all ranks on GPU 0
TJ009  ddp-before-device               error    DDP wraps a model that is moved to the device afterwards
TJ010  no-seed                         warning  no seed and no DDP: ranks start from different weights
TJ011  sync-in-hot-loop                warning  ``.item()`` / collectives every step inside the training loop
TJ012  unscaled-learning-rate          hint     a literal lr: the global batch grows with the world size
TJ013  batchnorm-without-syncbn        hint     BatchNorm under DDP computes statistics per rank
TJ014  device-from-global-rank         error    ``set_device(rank)``: the global rank is no GPU index past node 0
TJ015  nccl-env-on-cpu-job             warning  manifest: ``NCCL_*`` variables on a job without GPUs (it uses gloo)
TJ016  ib-disabled-with-rdma           warning  manifest: ``NCCL_IB_DISABLE=1`` with RDMA devices requested
TJ017  no-dev-shm-on-multi-gpu         error    manifest: several GPUs per node, no memory-backed ``/dev/shm``
TJ018  megatron-layout                 error    manifest: a Megatron-LM ``pretrain_gpt.py`` layout that does not fit the
                                                job's world size, or a flag value it refuses
=====  ==============================  =======  ========================================================

Rules about ranks (TJ003-TJ005, TJ008, TJ010, TJ012) apply only to scripts that use torch.distributed, DDP, FSDP or
trainjob.torch. TJ015-TJ018 (:data:`MANIFEST_RULES`) apply to manifests (``trainjob check job.yaml``):
:mod:`trainjob.runtime.nccl` and :mod:`trainjob.tools.megatron`.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from typing import Any

from trainjob.tools.script import Rule, Script, dotted_name

__all__ = ["MANIFEST_RULES", "RULES"]

Found = Iterator[tuple[ast.AST, str, str]]

_OPTIMIZERS = ("SGD", "Adam", "AdamW", "Adagrad", "RMSprop", "Adamax", "NAdam", "RAdam", "LAMB", "Lion")
_COLLECTIVES = ("all_reduce", "all_gather", "all_gather_object", "barrier", "reduce", "gather", "broadcast")


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _is_constant(node: ast.expr | None, value: object) -> bool:
    return isinstance(node, ast.Constant) and node.value == value


def _given(node: ast.expr | None) -> bool:
    return node is not None and not _is_constant(node, None)


def sampler_without_set_epoch(script: Script) -> Found:
    if not script.calls_to("set_epoch"):
        for call in script.calls_to("DistributedSampler"):
            if _is_constant(_keyword(call, "shuffle"), False):
                continue  # an unshuffled sampler (evaluation) has no epoch-dependent order
            yield (
                call,
                "DistributedSampler is created but set_epoch() is never called",
                "call sampler.set_epoch(epoch) at the start of every epoch, or every epoch repeats the first one's order",
            )


def shuffle_with_sampler(script: Script) -> Found:
    for call in script.calls_to("DataLoader"):
        if _is_constant(_keyword(call, "shuffle"), True) and (
            _given(_keyword(call, "sampler")) or _given(_keyword(call, "batch_sampler"))
        ):
            yield (
                call,
                "DataLoader gets shuffle=True and a sampler; PyTorch raises 'sampler option is mutually exclusive with shuffle'",
                "drop shuffle=True from the DataLoader and shuffle in the sampler: DistributedSampler(dataset, shuffle=True)",
            )


def loader_without_sampler(script: Script) -> Found:
    if not script.is_distributed:
        return
    for call in script.calls_to("DataLoader"):
        wrapped = any(
            isinstance(p, ast.Call) and dotted_name(p.func).endswith("prepare_data_loader")
            for p in script.ancestors(call)
        )
        if not wrapped and not (_given(_keyword(call, "sampler")) or _given(_keyword(call, "batch_sampler"))):
            yield (
                call,
                "DataLoader without a sampler in a distributed script: every rank reads the same samples",
                "pass sampler=DistributedSampler(dataset) (and drop shuffle=True), or use trainjob.torch.prepare_data_loader",
            )


def unguarded_save(script: Script) -> Found:
    if not script.is_distributed:
        return
    for name, call in script.calls:
        if name in ("torch.save", "save") and not script.rank_guarded(call):
            yield (
                call,
                "torch.save runs on every rank: all ranks write the same file at once",
                "save on rank 0 only: if dist.get_rank() == 0: torch.save(model.module.state_dict(), path)",
            )


def unguarded_print(script: Script) -> Found:
    if not script.is_distributed:
        return
    for name, call in script.calls:
        is_log = name == "print" or (
            name.rsplit(".", 1)[-1] in ("info", "warning", "debug")
            and name.split(".")[0] in ("logging", "logger", "log")
        )
        per_rank = "rank" in ast.unparse(call).lower()  # "rank {rank} ready" is meant to print on every rank
        if is_log and not per_rank and not script.rank_guarded(call):
            yield (
                call,
                f"{name}() runs on every rank: each line appears once per process",
                "print on rank 0 only (if dist.get_rank() == 0: ...), or use trainjob.torch.print0",
            )


def missing_destroy_process_group(script: Script) -> Found:
    if not script.calls_to("destroy_process_group"):
        for call in script.calls_to("init_process_group"):
            yield (
                call,
                "init_process_group without destroy_process_group: the process group is never shut down cleanly",
                "call dist.destroy_process_group() when training ends, in a finally: block",
            )


def hard_coded_backend(script: Script) -> Found:
    checks_cuda = bool(script.calls_to("is_available"))
    uses_cuda = bool(script.calls_to("cuda")) or any("cuda" in s for s in script.strings)
    for call in script.calls_to("init_process_group"):
        backend = _keyword(call, "backend") or (call.args[0] if call.args else None)
        if _is_constant(backend, "nccl") and not checks_cuda:
            yield (
                call,
                'backend "nccl" is hard-coded and the script never checks torch.cuda.is_available(): it fails on CPU',
                'pick the backend: "nccl" if torch.cuda.is_available() else "gloo" (or leave it out and let PyTorch choose)',
            )
        elif _is_constant(backend, "gloo") and uses_cuda:
            yield (
                call,
                'backend "gloo" is hard-coded in a script that uses CUDA: GPU collectives are far slower than with nccl',
                'use "nccl" when torch.cuda.is_available(), "gloo" otherwise',
            )


def cuda_without_local_rank(script: Script) -> Found:
    if not script.is_distributed or script.mentions(
        "LOCAL_RANK", "local_rank", "set_device", "trainjob.torch"
    ):
        return
    for call in script.calls_to("cuda", "to", "device"):
        name = dotted_name(call.func)
        bare_cuda = name.endswith(".cuda") and (not call.args or _is_constant(call.args[0], 0))
        literal = any(_is_constant(a, "cuda") or _is_constant(a, "cuda:0") for a in call.args)
        if bare_cuda or (literal and not name.endswith(".cuda")):
            yield (
                call,
                f"{ast.unparse(call)} without LOCAL_RANK: every rank on this node uses GPU 0",
                'local_rank = int(os.environ["LOCAL_RANK"]); torch.cuda.set_device(local_rank); then .to(f"cuda:{local_rank}")',
            )


def ddp_before_device(script: Script) -> Found:
    moves = [(dotted_name(c.func).rsplit(".", 1)[0], c) for c in script.calls_to("to", "cuda")]
    for call in script.calls_to("DistributedDataParallel", "DDP"):
        if not call.args or not isinstance(call.args[0], ast.Name):
            continue
        model = call.args[0].id
        before = [c for name, c in moves if name == model and c.lineno < call.lineno]
        after = [c for name, c in moves if name == model and c.lineno > call.lineno]
        if after and not before:
            yield (
                call,
                f"DDP wraps {model} before it is moved to its device (line {after[0].lineno}); DDP keeps the old device",
                f"move first, then wrap: {model}.to(device); {model} = DDP({model}, device_ids=[local_rank])",
            )


def _seeds(name: str) -> bool:
    """Whether a called name seeds: ``manual_seed``, ``seed_everything``, ``set_seed``, a helper such as
    ``seed_all`` / ``init_seeds`` / ``fix_random_seed``; ``rank_seed`` only derives a number."""
    tail = name.rsplit(".", 1)[-1].lower()
    return "seed" in tail and tail not in ("rank_seed", "initial_seed", "get_seed")


def no_seed(script: Script) -> Found:
    if not script.is_distributed:
        return
    for name, _ in script.calls:
        head = name.split(".")[0]
        helper = script.helper_calls.get(head, [])
        if _seeds(name) or _seeds(script.imported_as.get(head, "")) or any(_seeds(inner) for inner in helper):
            return
    # DDP (also through trainjob.torch's prepare_model) broadcasts rank 0's parameters and buffers when it wraps
    # the model, and DistributedSampler shuffles with the same seed on every rank: the ranks agree without one.
    wrapped = script.calls_to("DistributedDataParallel", "DDP") or [
        call for call in script.calls_to("prepare_model")
        if not call.args[1:2] or _is_constant(call.args[1], "ddp")
    ] or [call for call in script.calls_to("FullyShardedDataParallel", "FSDP")
          if _is_constant(_keyword(call, "sync_module_states"), True)]  # fmt: skip
    if wrapped:
        return
    yield (
        script.tree.body[0] if script.tree.body else script.tree,
        "no random seed is set: ranks build different initial weights and runs cannot be reproduced",
        "torch.manual_seed(seed) on every rank before building the model (the same seed, so the weights agree), "
        "or trainjob.torch.seed_everything(seed)",
    )


def sync_in_hot_loop(script: Script) -> Found:
    for name, call in script.calls:
        tail = name.rsplit(".", 1)[-1]
        is_sync = tail == "item" and not call.args
        # Averaging gradients by hand (all_reduce(p.grad)) is the training step itself, not a metric.
        is_collective = (
            tail in _COLLECTIVES
            and name.split(".")[0] in ("dist", "torch")
            and not any("grad" in ast.unparse(arg) for arg in call.args)
        )
        if (is_sync or is_collective) and script.hot_loop(call) is not None:
            what = ".item() waits for the device" if is_sync else f"{name}() synchronises all ranks"
            yield (
                call,
                f"{what} on every training step",
                "keep the running value on the device and read or reduce it every N steps (if step % N == 0)",
            )


def unscaled_learning_rate(script: Script) -> Found:
    if not script.is_distributed:
        return
    for call in script.calls_to(*_OPTIMIZERS):
        lr = _keyword(call, "lr")
        if isinstance(lr, ast.Constant) and isinstance(lr.value, int | float):
            yield (
                call,
                f"lr={lr.value} is a constant while the global batch grows with the world size",
                "scale with the world size (linear rule lr × world_size, with warm-up), or keep the global batch fixed",
            )


def batchnorm_without_syncbn(script: Script) -> Found:
    if not script.calls_to("DistributedDataParallel", "DDP") or script.mentions("SyncBatchNorm"):
        return
    for name, call in script.calls:
        if name.rsplit(".", 1)[-1] in ("BatchNorm1d", "BatchNorm2d", "BatchNorm3d"):
            yield (
                call,
                f"{name.rsplit('.', 1)[-1]} under DDP normalises with each rank's own batch statistics",
                "model = nn.SyncBatchNorm.convert_sync_batchnorm(model) before wrapping in DDP, if per-rank batches are small",
            )


def device_from_global_rank(script: Script) -> Found:
    devices = [c.args[0] for c in script.calls_to("set_device", "cuda") if c.args]
    devices += [k.value.elts[0] for c in script.calls for k in c[1].keywords
                if k.arg == "device_ids" and isinstance(k.value, ast.List) and k.value.elts]  # fmt: skip
    for node in devices:
        if isinstance(node, ast.Name) and node.id in ("rank", "global_rank"):
            yield (
                node,
                f"GPU index taken from the global rank '{node.id}': on the second node it is >= the GPUs per node",
                'use the local rank: local_rank = int(os.environ["LOCAL_RANK"]); torch.cuda.set_device(local_rank)',
            )


def _nccl_rule(rule_id: str) -> Callable[[Any], Iterator[tuple[str, str, str]]]:
    """The manifest rule ``rule_id``: the NCCL findings of that id for a resolved plan."""

    def find(plan: Any) -> Iterator[tuple[str, str, str]]:
        from trainjob.runtime.nccl import nccl_findings

        for finding in nccl_findings(plan):
            if finding.rule == rule_id:
                yield finding.subject, finding.message, finding.fix

    return find


def megatron_layout(plan: Any) -> Iterator[tuple[str, str, str]]:
    """The trainer's Megatron-LM launch checked against ``numNodes × numProcPerNode`` (:mod:`trainjob.tools.megatron`)."""
    from trainjob.errors import ValidationError
    from trainjob.tools.megatron import (
        accepted_values,
        find_megatron_launch,
        layout_problems,
        parse_megatron_args,
    )

    container = plan.trainer().container()
    launch = find_megatron_launch([*container.command, *container.args])
    if launch is None:
        return
    if launch.broken_continuations:
        line, more = launch.broken_continuations[0], len(launch.broken_continuations) - 1
        yield (
            line.split()[0],
            f"{launch.script}: the line '{line}' ends in a backslash followed by spaces"
            + (f" ({more} more lines do too)" if more else "")
            + ", so the shell ends the command there: the flags on the lines after it never reach the script",
            "put the backslash last on the line, and comments on lines of their own",
        )
    try:
        args = parse_megatron_args(launch.args, container.env_dict())
    except ValidationError as exc:
        for error in exc.errors:
            yield (
                error.path,
                f"{launch.script}: {error.path}: {error.message}",
                f"give {error.path} {accepted_values(error.path)}: Megatron-LM stops at start-up on anything else",
            )
        return
    world_size = plan.num_nodes * plan.num_proc_per_node
    for problem in layout_problems(args, world_size, plan.num_proc_per_node):
        yield problem.flag, f"{launch.script}: {problem.message}", problem.fix


RULES: tuple[Rule, ...] = (
    Rule("TJ001", "sampler-without-set-epoch", "error", sampler_without_set_epoch),
    Rule("TJ002", "shuffle-with-sampler", "error", shuffle_with_sampler),
    Rule("TJ003", "loader-without-sampler", "warning", loader_without_sampler),
    Rule("TJ004", "unguarded-save", "error", unguarded_save),
    Rule("TJ005", "unguarded-print", "warning", unguarded_print),
    Rule("TJ006", "missing-destroy-process-group", "warning", missing_destroy_process_group),
    Rule("TJ007", "hard-coded-backend", "warning", hard_coded_backend),
    Rule("TJ008", "cuda-without-local-rank", "error", cuda_without_local_rank),
    Rule("TJ009", "ddp-before-device", "error", ddp_before_device),
    Rule("TJ010", "no-seed", "warning", no_seed),
    Rule("TJ011", "sync-in-hot-loop", "warning", sync_in_hot_loop),
    Rule("TJ012", "unscaled-learning-rate", "hint", unscaled_learning_rate),
    Rule("TJ013", "batchnorm-without-syncbn", "hint", batchnorm_without_syncbn),
    Rule("TJ014", "device-from-global-rank", "error", device_from_global_rank),
)

#: The rules for manifests (``trainjob check job.yaml``), kept apart from the script rules above.
MANIFEST_RULES: tuple[Rule, ...] = (
    Rule("TJ015", "nccl-env-on-cpu-job", "warning", _nccl_rule("TJ015"), applies_to="manifest"),
    Rule("TJ016", "ib-disabled-with-rdma", "warning", _nccl_rule("TJ016"), applies_to="manifest"),
    Rule("TJ017", "no-dev-shm-on-multi-gpu", "error", _nccl_rule("TJ017"), applies_to="manifest"),
    Rule("TJ018", "megatron-layout", "error", megatron_layout, applies_to="manifest"),
)
