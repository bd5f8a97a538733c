"""Megatron-LM launches: find ``pretrain_gpt.py`` in a command line, read its parallel layout, check it against the
job's world size (``trainjob check job.yaml``, rule TJ018) and describe it to the planner (``trainjob plan
--megatron-args "..."``).

===================================  =========================  ==============================================
flag                                 field                      meaning (Megatron-LM's default)
===================================  =========================  ==============================================
``--tensor-model-parallel-size``     ``tp``                     ranks each layer's matrices are split over (1)
``--pipeline-model-parallel-size``   ``pp``                     pipeline stages, ``layers / pp`` layers each (1)
``--num-layers``                     ``layers``                 transformer layers
``--hidden-size``                    ``hidden``                 hidden size
``--num-attention-heads``            ``heads``                  attention heads
``--seq-length``                     ``seq``                    tokens per sequence
``--micro-batch-size``               ``micro_batch``            sequences per GPU in one forward/backward
``--global-batch-size``              ``global_batch``           sequences per optimizer step (micro batch × dp)
``--fp16`` / ``--bf16``              ``dtype``                  mixed precision (fp32 without either)
``--sequence-parallel``              ``sequence_parallel``      layer-norm and dropout activations split over TP
``--use-distributed-optimizer``      ``distributed_optimizer``  optimizer states sharded over dp (ZeRO-1)
``--recompute-activations``          ``recompute``              ``selective``: attention scores recomputed
``--recompute-granularity``          ``recompute``              ``selective``, or ``full``: every layer
                                                                recomputed from its input
``--use-flash-attn``                 ``flash_attention``        fused attention: no stored score matrices
``--optimizer``                      ``optimizer``              ``adam`` or ``sgd`` (adam)
===================================  =========================  ==============================================

Other flags are passed over. A value may be ``$(VAR)``, ``$VAR`` or ``${VAR}`` when the trainer's env sets
``VAR``; one the env does not set is filled in only at run time, so the checks that need it are skipped.

The data-parallel size is what is left, ``dp = world / (tp × pp)``. Megatron-LM gives neighbouring ranks the same
tensor-parallel group, so a TP group stays inside a node when ``tp`` divides the processes per node. The layout
rules, each naming the flag, its value and one that works:

- ``tp × pp`` divides the world size (``--tensor-model-parallel-size`` or ``--pipeline-model-parallel-size``);
- ``tp`` divides the processes per node: TP all-reduces inside every layer and needs the fast links;
- ``--num-layers`` divides by ``pp``, ``--num-attention-heads`` by ``tp``, ``--hidden-size`` by the heads;
- ``--global-batch-size`` is a multiple of ``micro batch × dp``;
- with ``--sequence-parallel``, ``--seq-length`` divides by ``tp``.

>>> launch = find_megatron_launch(["bash", "-c", "cd /workspace && torchrun --nproc-per-node 8 pretrain_gpt.py "
...                                "--tensor-model-parallel-size 8 --num-layers 96 --bf16 && echo done"])
>>> launch.script, launch.args
('pretrain_gpt.py', ['--tensor-model-parallel-size', '8', '--num-layers', '96', '--bf16'])
>>> args = parse_megatron_args(launch.args)
>>> (args.tp, args.pp, args.layers, args.dtype)
(8, 1, 96, 'bf16')
>>> [p.flag for p in layout_problems(args, world_size=48, procs_per_node=4)]
['--tensor-model-parallel-size']
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trainjob.errors import ValidationError
from trainjob.tools.training_setup import TrainingSetup

__all__ = [
    "LayoutProblem",
    "MegatronArgs",
    "MegatronLaunch",
    "accepted_values",
    "find_megatron_launch",
    "layout_problems",
    "megatron_setup",
    "parse_megatron_args",
]

#: Flags with a whole-number value, and the :class:`MegatronArgs` field each sets.
INT_FLAGS: dict[str, str] = {
    "--tensor-model-parallel-size": "tp",
    "--pipeline-model-parallel-size": "pp",
    "--num-layers": "layers",
    "--hidden-size": "hidden",
    "--num-attention-heads": "heads",
    "--seq-length": "seq",
    "--micro-batch-size": "micro_batch",
    "--global-batch-size": "global_batch",
}
#: Flags with a value from a fixed set.
CHOICE_FLAGS: dict[str, tuple[str, ...]] = {"--recompute-granularity": ("full", "selective"), "--optimizer": ("adam", "sgd")}
SWITCHES = ("--fp16", "--bf16", "--sequence-parallel", "--use-distributed-optimizer", "--recompute-activations",
            "--use-flash-attn")  # fmt: skip
FLAG_OF: dict[str, str] = {name: flag for flag, name in INT_FLAGS.items()}

_SCRIPT = re.compile(r"(?:.*/)?pretrain_\w+\.py")
_SHELLS = ("sh", "bash", "dash", "zsh")
_OPERATORS = ("&&", "||", ";", "|", "&")
_VARIABLE = re.compile(r"\$\((\w+)\)|\$\{(\w+)\}|\$(\w+)")
# A backslash, then spaces (and maybe a comment) ends the line: the flags on the next lines are a new command.
_BROKEN_CONTINUATION = re.compile(r"\\[ \t]+(#.*)?$")


@dataclass(frozen=True)
class MegatronLaunch:
    """A ``pretrain_*.py`` found in a command line: the script as written and the arguments after it."""

    script: str
    args: list[str]
    #: Shell lines that end in a backslash followed by spaces: they do not continue onto the next line.
    broken_continuations: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class MegatronArgs:
    """The flags of the module docstring's table that a Megatron-LM command line sets (defaults: Megatron-LM's)."""

    tp: int = 1
    pp: int = 1
    layers: int | None = None
    hidden: int | None = None
    heads: int | None = None
    seq: int | None = None
    micro_batch: int | None = None
    global_batch: int | None = None
    dtype: str = "fp32"
    sequence_parallel: bool = False
    distributed_optimizer: bool = False
    recompute: str | None = None
    flash_attention: bool = False
    optimizer: str = "adam"
    #: Flags whose value the shell fills in at run time (``$TP`` with no ``TP`` in the env): not checked.
    unresolved: tuple[str, ...] = ()


@dataclass(frozen=True)
class LayoutProblem:
    """A layout that Megatron-LM refuses or runs badly: the flag to change, why, and a value that works."""

    flag: str
    message: str
    fix: str


def _shell_words(text: str) -> tuple[list[str], list[str]]:
    """The words of a shell script (line by line, comments dropped, ``;`` between lines), and its lines that end in
    a backslash and spaces."""
    broken = [line.strip() for line in text.splitlines() if _BROKEN_CONTINUATION.search(line)]
    words: list[str] = []
    for line in text.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split = True
        try:
            words += [*lexer, ";"]
        except ValueError:  # an unclosed quote: read it as plain words
            words += [*line.split(), ";"]
    return words, broken


def find_megatron_launch(tokens: Sequence[str]) -> MegatronLaunch | None:
    """The ``pretrain_*.py`` launch in a container's ``command + args``, or None. The script of a shell
    (``bash -c "..."``) is split as the shell splits it; the arguments end at ``&&``, ``;``, ``|`` or a line end."""
    words: list[str] = []
    broken: list[str] = []
    shell = bool(tokens) and tokens[0].rsplit("/", 1)[-1] in _SHELLS
    for index, token in enumerate(tokens):
        previous = tokens[index - 1] if index else ""
        if shell and previous.startswith("-") and not previous.startswith("--") and previous.endswith("c"):
            found, lines = _shell_words(token)
            words += found
            broken += lines
        else:
            words.append(token)
    for index, word in enumerate(words):
        if _SCRIPT.fullmatch(word):
            rest = words[index + 1 :]
            end = next((i for i, w in enumerate(rest) if w in _OPERATORS), len(rest))
            return MegatronLaunch(word.rsplit("/", 1)[-1], rest[:end], broken)
    return None


def _expand(text: str, env: Mapping[str, str]) -> str | None:
    """``text`` with ``$(VAR)``, ``${VAR}`` and ``$VAR`` filled in from ``env``; None when one is not there."""
    missing = False

    def value(match: re.Match[str]) -> str:
        nonlocal missing
        name = next(group for group in match.groups() if group)
        if name not in env:
            missing = True
            return ""
        return env[name]

    expanded = _VARIABLE.sub(value, text)
    return None if missing else expanded


def accepted_values(flag: str) -> str:
    """What Megatron-LM accepts for ``flag``: ``accepted_values("--optimizer") == "adam or sgd"``."""
    if flag in CHOICE_FLAGS:
        return " or ".join(CHOICE_FLAGS[flag])
    return "a whole number >= 1" if flag in INT_FLAGS else "one of --fp16 and --bf16"


def parse_megatron_args(tokens: Sequence[str], env: Mapping[str, str] | None = None) -> MegatronArgs:
    """The :class:`MegatronArgs` of a ``pretrain_gpt.py`` argument list (``--flag value`` or ``--flag=value``).

    A value Megatron-LM would refuse raises :class:`ValidationError` on the flag, saying what it accepts:

    >>> parse_megatron_args(["--num-layers", "ninety-six"])
    Traceback (most recent call last):
    ...
    trainjob.errors.ValidationError: --num-layers: must be a whole number >= 1, got 'ninety-six'
    """
    env = env or {}
    values: dict[str, Any] = {}
    unresolved: list[str] = []
    errors: list[ValidationError] = []
    position = 0
    while position < len(tokens):
        flag, equals, inline = tokens[position].partition("=")
        position += 1
        if flag in SWITCHES:
            values[flag] = True
            continue
        if flag not in INT_FLAGS and flag not in CHOICE_FLAGS:
            continue
        accepted = accepted_values(flag)
        if equals:
            text = inline
        elif position < len(tokens) and not tokens[position].startswith("--"):
            text, position = tokens[position], position + 1
        else:
            errors.append(ValidationError(flag, f"needs a value: {accepted}"))
            continue
        expanded = _expand(text, env)
        if expanded is None:
            unresolved.append(flag)
        elif flag in CHOICE_FLAGS:
            if expanded not in CHOICE_FLAGS[flag]:
                errors.append(ValidationError(flag, f"must be {accepted}, got {text!r}"))
            values[flag] = expanded
        elif not expanded.isdigit() or int(expanded) < 1:
            errors.append(ValidationError(flag, f"must be {accepted}, got {text!r}"))
        else:
            values[flag] = int(expanded)
    if values.get("--fp16") and values.get("--bf16"):
        errors.append(ValidationError("--bf16", "and --fp16 are both given; Megatron-LM takes one of them"))
    if errors:
        raise ValidationError.combine(errors)
    recompute = values.get("--recompute-granularity") or ("selective" if values.get("--recompute-activations") else None)
    return MegatronArgs(
        **{name: values[flag] for flag, name in INT_FLAGS.items() if flag in values},
        dtype="fp16" if values.get("--fp16") else "bf16" if values.get("--bf16") else "fp32",
        sequence_parallel=bool(values.get("--sequence-parallel")),
        distributed_optimizer=bool(values.get("--use-distributed-optimizer")),
        recompute=recompute,
        flash_attention=bool(values.get("--use-flash-attn")),
        optimizer=values.get("--optimizer", "adam"),
        unresolved=tuple(unresolved),
    )


def _closest(value: int, candidates: Sequence[int]) -> int | None:
    """The candidate nearest ``value`` (the larger one on a tie)."""
    return min(candidates, key=lambda c: (abs(c - value), -c), default=None)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _multiple_near(value: int, step: int) -> int:
    return max(step, round(value / step) * step)


def layout_problems(args: MegatronArgs, world_size: int, procs_per_node: int) -> list[LayoutProblem]:
    """What is wrong with ``args`` on ``world_size`` ranks, ``procs_per_node`` on each node (module docstring)."""
    problems: list[LayoutProblem] = []
    tp, pp, layers, heads = args.tp, args.pp, args.layers, args.heads
    known = {name for name in ("tp", "pp") if FLAG_OF[name] not in args.unresolved}
    where = f"{world_size} ranks = {world_size // procs_per_node} nodes × {procs_per_node} processes"

    def fits_tp(c: int) -> bool:
        return procs_per_node % c == 0 and world_size % (c * pp) == 0 and (heads is None or heads % c == 0)

    def fits_pp(c: int) -> bool:
        return world_size % (tp * c) == 0 and (layers is None or layers % c == 0)

    tp_choice = _closest(tp, [c for c in _divisors(procs_per_node) if fits_tp(c)])
    pp_choice = _closest(pp, [c for c in _divisors(world_size // tp) if fits_pp(c)] if world_size % tp == 0 else [])
    if known != {"tp", "pp"}:
        return problems
    if world_size % (tp * pp):
        if world_size % tp == 0 and pp_choice is not None:
            flag, value, fix = FLAG_OF["pp"], pp, f"use --pipeline-model-parallel-size {pp_choice}"
        else:
            flag, value, fix = FLAG_OF["tp"], tp, f"use --tensor-model-parallel-size {tp_choice or 1}"
        problems.append(LayoutProblem(
            flag, f"{flag} {value}: tp × pp = {tp} × {pp} = {tp * pp} does not divide the world size ({where})",
            f"{fix}, or a world size that is a multiple of {tp * pp}",
        ))  # fmt: skip
        return problems  # the data-parallel size, which the rest needs, is no whole number
    if procs_per_node % tp:
        problems.append(LayoutProblem(
            FLAG_OF["tp"],
            f"--tensor-model-parallel-size {tp}: a tensor-parallel group crosses nodes, which run {procs_per_node} "
            "processes each; TP communicates inside every layer and needs the links within a node",
            f"use --tensor-model-parallel-size {tp_choice or 1} (it divides {procs_per_node})",
        ))  # fmt: skip
    if layers is not None and layers % pp:
        problems.append(LayoutProblem(
            FLAG_OF["layers"],
            f"--num-layers {layers} does not divide by --pipeline-model-parallel-size {pp}: every stage needs "
            "the same whole number of layers",
            (f"use --pipeline-model-parallel-size {pp_choice}, or " if pp_choice else "use ")
            + f"--num-layers {_multiple_near(layers, pp)}",
        ))  # fmt: skip
    if heads is not None and heads % tp:
        problems.append(LayoutProblem(
            FLAG_OF["heads"],
            f"--num-attention-heads {heads} does not divide by --tensor-model-parallel-size {tp}: every TP rank "
            "computes whole heads",
            (f"use --tensor-model-parallel-size {tp_choice}, or " if tp_choice else "use ")
            + f"--num-attention-heads {_multiple_near(heads, tp)}",
        ))  # fmt: skip
    if heads is not None and args.hidden is not None and args.hidden % heads:
        problems.append(LayoutProblem(
            FLAG_OF["hidden"],
            f"--hidden-size {args.hidden} does not divide by --num-attention-heads {heads}",
            f"use --hidden-size {_multiple_near(args.hidden, heads)}",
        ))  # fmt: skip
    if args.sequence_parallel and args.seq is not None and args.seq % tp:
        problems.append(LayoutProblem(
            FLAG_OF["seq"],
            f"--seq-length {args.seq} does not divide by --tensor-model-parallel-size {tp}: --sequence-parallel "
            "splits every sequence over the TP ranks",
            f"use --seq-length {_multiple_near(args.seq, tp)}",
        ))  # fmt: skip
    dp = world_size // (tp * pp)
    micro = args.micro_batch
    if args.global_batch is not None and micro is not None and args.global_batch % (micro * dp):
        problems.append(LayoutProblem(
            FLAG_OF["global_batch"],
            f"--global-batch-size {args.global_batch} is not a multiple of --micro-batch-size {micro} × "
            f"data-parallel size {dp} (= {world_size} / (tp {tp} × pp {pp})) = {micro * dp}",
            f"use --global-batch-size {_multiple_near(args.global_batch, micro * dp)}",
        ))  # fmt: skip
    return problems


#: What ``trainjob plan --megatron-args`` assumes beyond the flags; printed with its estimate.
ASSUMPTIONS = (
    "model states as in the ZeRO paper: 2 bytes of weights and 2 of gradients per parameter (4 + 4 in fp32), "
    "12 of optimizer states with Adam (fp32 master weights, momentum, variance); --use-distributed-optimizer "
    "shards the optimizer states over dp (ZeRO-1)",
    "parameters 12 × layers × hidden² (GPT blocks, no embeddings unless --vocab is given), split evenly over tp × pp",
    "activations per layer and micro-batch s·b·h·(34 + 5·a·s/h) bytes (Korthikanti et al. 2022): "
    "10·s·b·h + 24·s·b·h/tp + 5·a·s²·b/tp without --sequence-parallel, everything / tp with it; selective "
    "recomputation or flash attention drops the 5·a·s²·b term, full recomputation keeps each layer's input",
    "1F1B schedule: the first stage holds pp micro-batches (at most the micro-batches per step) of its layers/pp layers; "
    "embedding, logits and framework buffers are not counted",
)


def megatron_setup(args: MegatronArgs, *, gpus: int, nodes: int, vocab: int | None = None,
                   params: float | None = None) -> TrainingSetup:  # fmt: skip
    """The :class:`TrainingSetup` of a Megatron-LM layout on ``nodes`` × ``gpus``, for the planner.

    The layout rules and the flags the estimate needs are checked first, so errors name Megatron-LM's flags.
    """
    problems = layout_problems(args, gpus * nodes, gpus)
    needed = ("layers", "hidden", "heads", "seq", "micro_batch")
    missing = [FLAG_OF[name] for name in needed if getattr(args, name) is None]
    errors = [ValidationError(flag, "is needed for the memory estimate (a whole number >= 1)") for flag in missing]
    errors += [ValidationError(flag, "is a shell variable here; give the number") for flag in args.unresolved]
    # A layout problem's message starts with its flag and value already.
    errors += [ValidationError("", f"{p.message}; {p.fix}") for p in problems]
    if errors:
        raise ValidationError.combine(errors)
    return TrainingSetup(
        params=params, gpus=gpus, nodes=nodes, zero=1 if args.distributed_optimizer else 0, tp=args.tp, pp=args.pp,
        dtype=args.dtype, optimizer=args.optimizer, layers=args.layers, hidden=args.hidden, heads=args.heads,  # type: ignore[arg-type]
        seq=args.seq, vocab=vocab, micro_batch=args.micro_batch or 1, global_batch=args.global_batch,
        activation_checkpointing=args.recompute == "full",
        flash_attention=args.flash_attention or args.recompute == "selective",
        sequence_parallel=args.sequence_parallel,
    )  # fmt: skip
