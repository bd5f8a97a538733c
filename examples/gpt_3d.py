"""Train a small GPT with 3-D parallelism (pipeline x tensor x data) on generated arithmetic text.

The text is a stream of sums (``"417+86=503;"``) read byte by byte, so the model has something to learn: the loss
falls from ln(256) = 5.5 towards the entropy of the random operands. Every layout trains the same model on the
same batches; each data-parallel replica reads its share of every global batch::

    torchrun --nproc-per-node 8 examples/gpt_3d.py --tp 2 --pp 2                 # dp = 8 / (2 * 2) = 2
    torchrun --nproc-per-node 4 examples/gpt_3d.py --tp 2 --pp 2 --schedule Interleaved1F1B --microbatches 4
    torchrun --nproc-per-node 4 examples/gpt_3d.py --tp 2 --dp-shard 2 --checkpoint-dir /tmp/gpt
    torchrun --nproc-per-node 4 examples/gpt_3d.py --dp-shard 4 --checkpoint-dir /tmp/gpt --steps 60   # resumes

The parallel sizes, batch sizes and model shape also go by Megatron-LM's flag names, meaning what they mean there
(and in ``trainjob check`` / ``trainjob plan --megatron-args``, whose layout rules this example applies too)::

    torchrun --nproc-per-node 8 examples/gpt_3d.py --tensor-model-parallel-size 2 \\
        --pipeline-model-parallel-size 2 --micro-batch-size 2 --global-batch-size 16 --bf16

On CUDA it also prints tokens/s and the model FLOPs utilisation (MFU) against the GPU's dense bf16 peak.
"""

from __future__ import annotations

import argparse
import random
import time

import torch

import trainjob.torch as tt
from trainjob.tools.megatron import MegatronArgs, layout_problems
from trainjob.torch.parallel import SCHEDULES, ParallelDims, PipelineConfig, parallelize
from trainjob.torch.parallel.gpt import GPT, GPTConfig, transformer_flops_per_token

# Dense bf16 tensor-core peak per GPU, FLOP/s (vendor data sheets, SXM parts).
PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "L4": 121e12}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tp", "--tensor-model-parallel-size", dest="tp", type=int, default=1,
                        help="tensor-parallel degree")  # fmt: skip
    parser.add_argument("--pp", "--pipeline-model-parallel-size", dest="pp", type=int, default=1,
                        help="pipeline-parallel degree")  # fmt: skip
    parser.add_argument("--dp-replicate", type=int, default=1, help="replicated data-parallel degree (HSDP)")
    parser.add_argument("--dp-shard", type=int, default=-1, help="sharded data-parallel degree; -1: the rest")
    parser.add_argument("--zero-stage", type=int, default=3, choices=[0, 1, 2, 3])
    parser.add_argument("--schedule", default="1F1B", choices=list(SCHEDULES))
    parser.add_argument("--microbatches", type=int, default=None, help="default: the number of stages")
    parser.add_argument("--micro-batch-size", type=int, default=None,
                        help="sequences per micro-batch on one data-parallel rank: microbatches = batch / (this × dp)")
    parser.add_argument("--sequence-parallel", action="store_true")
    parser.add_argument("--activation-checkpointing", action="store_true")
    parser.add_argument("--mixed-precision", choices=["bf16", "fp16"], default=None)
    parser.add_argument("--bf16", "--fp16", dest="mixed_precision", action=_Precision, nargs=0,
                        help="the same as --mixed-precision bf16 / fp16")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch-size", "--global-batch-size", dest="batch_size", type=int, default=16,
                        help="global batch, in sequences")
    parser.add_argument("--seq-len", "--seq-length", dest="seq_len", type=int, default=64)
    parser.add_argument("--dim", "--hidden-size", dest="dim", type=int, default=64)
    parser.add_argument("--heads", "--num-attention-heads", dest="heads", type=int, default=4)
    parser.add_argument("--layers", "--num-layers", dest="layers", type=int, default=4)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--clip", type=float, default=1.0, help="gradient-norm clipping threshold")
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--checkpoint-dir", default=None, help="resume from and save to this directory")
    parser.add_argument("--save-every", type=int, default=20)
    return parser.parse_args(argv)


class _Precision(argparse.Action):
    """``--bf16`` / ``--fp16`` (Megatron-LM's switches) set ``mixed_precision`` to the flag's name."""

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[no-untyped-def]
        setattr(namespace, self.dest, option_string.lstrip("-"))


def check_layout(args: argparse.Namespace, world_size: int, procs_per_node: int) -> int | None:
    """Exit naming the flag when Megatron-LM's layout rules refuse the sizes (the rules ``trainjob check`` applies);
    the micro-batches per step that ``--micro-batch-size`` gives, else ``--microbatches``."""
    layout = MegatronArgs(tp=args.tp, pp=args.pp, layers=args.layers, hidden=args.dim, heads=args.heads,
                          seq=args.seq_len, micro_batch=args.micro_batch_size, global_batch=args.batch_size,
                          sequence_parallel=args.sequence_parallel)  # fmt: skip
    problems = layout_problems(layout, world_size, procs_per_node)
    if problems:
        raise SystemExit("\n".join(f"{p.message}\n  fix: {p.fix}" for p in problems))
    if args.micro_batch_size is None:
        return args.microbatches
    dp = world_size // (args.tp * args.pp)
    microbatches = args.batch_size // (args.micro_batch_size * dp)
    if args.microbatches not in (None, microbatches):
        raise SystemExit(f"--microbatches {args.microbatches} disagrees with --micro-batch-size {args.micro_batch_size}"
                         f" (--global-batch-size {args.batch_size} / ({args.micro_batch_size} × dp {dp}) = "
                         f"{microbatches}); give one of them")  # fmt: skip
    if args.pp == 1 and microbatches > 1:
        raise SystemExit(f"--micro-batch-size {args.micro_batch_size}: without pipeline parallelism this example runs "
                         f"a replica's {args.batch_size // dp} sequences as one micro-batch; use --micro-batch-size "
                         f"{args.batch_size // dp}, or --pipeline-model-parallel-size > 1")  # fmt: skip
    return microbatches


def arithmetic_text(n_sums: int, seed: int = 0) -> torch.Tensor:
    """Bytes of ``n_sums`` random sums such as ``"417+86=503;"``."""
    rng = random.Random(seed)
    sums = []
    for _ in range(n_sums):
        a, b = rng.randrange(1000), rng.randrange(1000)
        sums.append(f"{a}+{b}={a + b};")
    return torch.frombuffer(bytearray("".join(sums).encode()), dtype=torch.uint8).long()


def global_batch(
    text: torch.Tensor, step: int, batch_size: int, seq_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same windows on every rank for a given step: inputs and next-byte targets."""
    generator = torch.Generator().manual_seed(step)
    starts = torch.randint(0, len(text) - seq_len - 1, (batch_size,), generator=generator)
    windows = torch.stack([text[s : s + seq_len + 1] for s in starts.tolist()])
    return windows[:, :-1], windows[:, 1:]


def peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((flops for key, flops in PEAK_BF16_FLOPS.items() if key in name), None)


def main() -> None:
    args = parse_args()
    ctx = tt.init()
    microbatches = check_layout(args, ctx.world_size, ctx.local_world_size)
    dims = ParallelDims(args.dp_replicate, args.dp_shard, args.tp, args.pp, ctx.world_size)
    tt.print0(dims.layout())
    cfg = GPTConfig(
        vocab_size=256, max_seq_len=args.seq_len, dim=args.dim, n_heads=args.heads, n_layers=args.layers
    )
    if args.batch_size % dims.dp:
        raise SystemExit(f"--batch-size {args.batch_size} must be a multiple of dp={dims.dp}")

    torch.manual_seed(0)  # the same initial weights on every rank, before each keeps its share
    model = parallelize(
        GPT(cfg),
        dims,
        mixed_precision=args.mixed_precision,
        activation_checkpointing=args.activation_checkpointing,
        zero_stage=args.zero_stage,
        sequence_parallel=args.sequence_parallel,
        pipeline=PipelineConfig(schedule=args.schedule, microbatches=microbatches),
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    checkpointer = tt.Checkpointer(args.checkpoint_dir, keep_last=2) if args.checkpoint_dir else None
    start = checkpointer.resume(model, optimizer) if checkpointer else 0
    if start:
        tt.print0(f"resumed at step {start} from {args.checkpoint_dir}")

    text = arithmetic_text(20_000)
    share = args.batch_size // dims.dp
    tokens_per_step = args.batch_size * args.seq_len
    flops_per_token = transformer_flops_per_token(cfg, args.seq_len)
    timed_from, started = (
        start + min(3, args.steps - start - 1),
        None,
    )  # the first steps build stages, warm up
    for step in range(start, args.steps):
        if step == timed_from:
            if ctx.device.type == "cuda":
                torch.cuda.synchronize()
            started = time.perf_counter()
        inputs, targets = global_batch(text, step, args.batch_size, args.seq_len)
        rows = slice(model.dp_rank * share, (model.dp_rank + 1) * share)
        loss = model.train_step(inputs[rows], targets[rows])
        tt.clip_grad_norm_(model, args.clip)  # the norm spans every stage and shard
        optimizer.step()
        optimizer.zero_grad()
        if (step + 1) % args.log_every == 0 or step + 1 == args.steps:
            tt.report({"loss": loss}, step=step + 1, total_steps=args.steps)  # printed by rank 0
        if checkpointer and (step + 1) % args.save_every == 0:
            checkpointer.save(step + 1, model, optimizer)

    inputs, targets = global_batch(text, -1, args.batch_size, args.seq_len)  # a batch training never draws
    tt.print0(f"held-out loss {model.evaluate(inputs[rows], targets[rows]).item():.4f}")
    if started is not None:
        if ctx.device.type == "cuda":
            torch.cuda.synchronize()
        timed_steps = args.steps - timed_from
        tokens_per_s = timed_steps * tokens_per_step / (time.perf_counter() - started)
        line = f"{tokens_per_s:,.0f} tokens/s over {timed_steps} steps on {ctx.world_size} {ctx.device.type} ranks"
        peak = peak_flops(ctx.device)
        if peak is not None:
            line += f", MFU {tokens_per_s * flops_per_token / (ctx.world_size * peak):.1%} of dense bf16 peak"
        tt.print0(line)
    tt.shutdown()


if __name__ == "__main__":
    main()
