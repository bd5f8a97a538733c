"""One-shot GPU measurements of trainjob against plain PyTorch, step after step, each in its own time budget.

    bash benchmarks/gpu/run.sh --out "$OUT"           # on the GPU machine: about 7 minutes on one H100
    python benchmarks/gpu/run.py --dry-run --out DIR  # the same steps on the CPU with tiny sizes

Every step (and every throughput variant) runs in a subprocess of its own with a timeout, so a hang or a crash
costs only that step: it is recorded as ``failed`` with the error and the tail of its traceback, and the next step
runs. Results go to ``DIR/gpu-results.json`` and ``DIR/gpu-results.md`` (one table per step).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "src"))  # trainjob, when run without run.sh

# Dense bf16 tensor-core peak per GPU, FLOP/s (SXM data sheets), matched against the device name.
PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "L4": 121e12}
TORCHTITAN_SKIP = (
    "torchtitan 0.2.0's wheel is small (0.28 MiB, pure Python) but requires torchdata, datasets, tokenizers, tyro "
    "and tensorboard, none on the GPU machine, and torchtitan.models.llama3 imports its tokenizer and HF dataset "
    "modules at import time; compared against plain FSDP2 (fully_shard) instead"
)

Result = dict[str, Any]


@dataclass(frozen=True)
class Config:
    """Sizes and budgets of one run; :func:`config` gives the GPU's or the dry run's."""

    dry_run: bool
    dim: int
    layers: int
    heads: int
    vocab: int
    seq: int
    batch: int
    warmup_steps: int
    timed_steps: int
    ckpt_bytes: int
    collective_sizes: list[int]
    budgets: dict[str, float] = field(default_factory=dict)


def config(dry_run: bool, ckpt_gb: float | None) -> Config:
    if dry_run:
        return Config(
            dry_run=True, dim=64, layers=2, heads=4, vocab=256, seq=64, batch=2, warmup_steps=1, timed_steps=2,
            ckpt_bytes=int((ckpt_gb if ckpt_gb is not None else 0.008) * 1e9), collective_sizes=[1 << 10, 1 << 16],
            budgets={"env": 30, "eager": 40, "ac": 40, "compile": 5, "plain": 40, "collectives": 60,
                     "checkpoint": 60, "planner": 30},
        )  # fmt: skip
    return Config(
        dry_run=False, dim=2048, layers=16, heads=16, vocab=32000, seq=2048, batch=4, warmup_steps=3, timed_steps=10,
        ckpt_bytes=int((ckpt_gb if ckpt_gb is not None else 2.0) * 1e9),
        collective_sizes=[1 << 20, 16 << 20, 256 << 20],
        budgets={"env": 20, "eager": 50, "ac": 50, "compile": 120, "plain": 50, "collectives": 40,
                 "checkpoint": 70, "planner": 20},
    )  # fmt: skip


# -- the subprocess runner ------------------------------------------------------------------------------------


def run_child(name: str, cfg: Config, budget: float, extra: dict[str, Any] | None = None) -> Result:
    """Run ``CHILDREN[name](cfg, **extra)`` in a fresh process for at most ``budget`` seconds; its result, or
    ``{"status": "failed", "error": ..., "traceback_tail": ...}``."""
    with tempfile.TemporaryDirectory(prefix="gpu-bench-") as tmp:
        result_path = Path(tmp) / "result.json"
        args = {"cfg": asdict(cfg), "extra": extra or {}, "result": str(result_path)}
        started = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--child", name, "--child-args", json.dumps(args)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )  # fmt: skip
        try:
            output, _ = proc.communicate(timeout=budget)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the step's whole process group: spawned ranks too
            output, _ = proc.communicate()
            return {"status": "failed", "error": f"timed out after {budget:.0f} s", "budget_s": budget,
                    "traceback_tail": _tail(output)}  # fmt: skip
        seconds = round(time.perf_counter() - started, 2)
        if proc.returncode != 0 or not result_path.exists():
            lines = [line for line in (output or "").strip().splitlines() if line.strip()]
            return {"status": "failed", "error": lines[-1] if lines else f"exit {proc.returncode}",
                    "exit_code": proc.returncode, "seconds": seconds, "traceback_tail": _tail(output)}  # fmt: skip
        result: Result = json.loads(result_path.read_text())
        result.setdefault("status", "ok")
        result.update(seconds=seconds, budget_s=budget)
        return result


def _tail(text: str | None, lines: int = 25) -> str:
    return "\n".join((text or "").strip().splitlines()[-lines:])


def child_main(name: str, raw: str) -> None:
    args = json.loads(raw)
    cfg = Config(**args["cfg"])
    result = CHILDREN[name](cfg, **args["extra"])
    Path(args["result"]).write_text(json.dumps(result, default=str))


# -- shared helpers (imported in children only: the parent never imports torch) -------------------------------


def device() -> Any:
    import torch

    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


def synchronize() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def peak_flops() -> float | None:
    import torch

    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(0)
    return next((flops for key, flops in PEAK_BF16_FLOPS.items() if key in name), None)


def gpt_config(cfg: Config) -> Any:
    from trainjob.torch.parallel.gpt import GPTConfig

    return GPTConfig(
        vocab_size=cfg.vocab, max_seq_len=cfg.seq, dim=cfg.dim, n_heads=cfg.heads, n_layers=cfg.layers
    )


def table(columns: list[str], rows: list[list[Any]]) -> dict[str, Any]:
    return {"columns": columns, "rows": rows}


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


# -- step 1: env ----------------------------------------------------------------------------------------------


def step_env(cfg: Config) -> Result:
    import torch

    info: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": sys.version.split()[0],
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        nccl = torch.cuda.nccl.version()
        info.update(device=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1),
                    nccl=".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl),
                    peak_bf16_flops=peak_flops())  # fmt: skip
    else:
        info.update(
            device="cpu", gpu_memory_gib=None, nccl=None, peak_bf16_flops=None, cpu_count=os.cpu_count()
        )
    return {**info, "table": table(["key", "value"], [[k, v] for k, v in info.items()])}


# -- step 2: throughput ---------------------------------------------------------------------------------------

VARIANTS = ("eager", "ac", "compile", "plain")


def train_variant(cfg: Config, variant: str) -> Result:
    """Train the GPT for warm-up plus timed steps with bf16 FSDP2 on one rank: through trainjob's ``parallelize``
    (``eager``, ``ac``, ``compile``) or ``fully_shard`` applied by hand (``plain``)."""
    import torch

    from trainjob.torch.parallel.gpt import GPT, transformer_flops_per_token

    dev = device()
    torch.manual_seed(0)
    model_cfg = gpt_config(cfg)
    with dev:
        model = GPT(model_cfg)
    n_params = sum(p.numel() for p in model.parameters())
    step_fn = _plain_fsdp(model) if variant == "plain" else _trainjob_fsdp(model, variant)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=dev.type == "cuda")
    tokens = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq + 1), device=dev)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    started = 0.0
    for step in range(cfg.warmup_steps + cfg.timed_steps):
        if step == cfg.warmup_steps:
            synchronize()
            started = time.perf_counter()
        loss = step_fn(inputs, targets)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    synchronize()
    seconds = time.perf_counter() - started
    tokens_per_s = cfg.timed_steps * cfg.batch * cfg.seq / seconds
    peak = peak_flops()
    flops = transformer_flops_per_token(model_cfg, cfg.seq)
    return {
        "variant": variant, "params": n_params, "tokens_per_s": round(tokens_per_s, 1),
        "step_s": round(seconds / cfg.timed_steps, 4), "loss": float(loss),
        "mfu": round(tokens_per_s * flops / peak, 4) if peak else None,
        "peak_memory_bytes": torch.cuda.max_memory_allocated() if dev.type == "cuda" else None,
    }  # fmt: skip


def _trainjob_fsdp(model: Any, variant: str) -> Callable[[Any, Any], Any]:
    import trainjob.torch as tt
    from trainjob.torch.parallel import ParallelDims, parallelize

    tt.init()  # one rank: gloo on CPU, NCCL on GPU, an in-process store
    if variant == "compile":
        for block in model.layers.children():
            block.compile()  # per block, before sharding: what torchtitan does
    parallel = parallelize(model, ParallelDims(world_size=1), mixed_precision="bf16",
                           activation_checkpointing=variant == "ac")  # fmt: skip
    return parallel.train_step


def _plain_fsdp(model: Any) -> Callable[[Any, Any], Any]:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    store = dist.HashStore()  # one rank: an in-process store, no file left behind
    dist.init_process_group(
        "nccl" if torch.cuda.is_available() else "gloo", store=store, rank=0, world_size=1
    )
    for block in model.layers.children():
        fully_shard(
            block, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        )
    fully_shard(model, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                                      output_dtype=torch.float32))  # fmt: skip

    def train_step(inputs: Any, targets: Any) -> Any:
        loss = F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())
        loss.backward()
        return loss.detach()

    return train_step


def step_throughput(cfg: Config) -> Result:
    variants: dict[str, Result] = {}
    for variant in VARIANTS:
        if variant == "compile" and cfg.dry_run:
            variants[variant] = {
                "status": "skipped",
                "reason": "torch.compile runs on the GPU only (dry run)",
            }
            continue
        variants[variant] = run_child("train_variant", cfg, cfg.budgets[variant], {"variant": variant})
    plain = variants["plain"].get("tokens_per_s")
    rows = []
    for name, r in variants.items():
        gib = r.get("peak_memory_bytes")
        rows.append([name, r.get("status"), r.get("tokens_per_s"), r.get("mfu"),
                     round(gib / 2**30, 2) if gib else None, ratio(r.get("tokens_per_s"), plain),
                     r.get("reason") or r.get("error")])  # fmt: skip
    failed = [name for name, r in variants.items() if r.get("status") == "failed"]
    return {
        "status": "failed" if failed else "ok",
        **({"error": f"variants failed: {', '.join(failed)}"} if failed else {}),
        "model": {"dim": cfg.dim, "layers": cfg.layers, "heads": cfg.heads, "vocab": cfg.vocab, "seq": cfg.seq,
                  "batch": cfg.batch, "kind": "trainjob.torch.parallel.gpt.GPT (GPT-2 style blocks)"},
        "variants": variants,
        "torchtitan": {"status": "skipped", "reason": TORCHTITAN_SKIP},
        "table": table(["variant", "status", "tokens/s", "MFU", "peak GiB", "ratio vs plain fully_shard", "note"],
                       rows),
    }  # fmt: skip


# -- step 3: collectives --------------------------------------------------------------------------------------


def step_collectives(cfg: Config) -> Result:
    """all_reduce at world size 1: trainjob's benchmark (its own spawned rank) and a plain ``dist.all_reduce`` loop."""
    import torch
    import torch.distributed as dist

    from trainjob.tools.collectives import run_collectives

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    iters, warmup = (5, 1) if cfg.dry_run else (20, 5)
    ours = {}
    for size in cfg.collective_sizes:
        rows = run_collectives(["all_reduce"], nproc=1, min_bytes=size, max_bytes=size, iters=iters, warmup=warmup,
                               backend=backend, timeout=cfg.budgets["collectives"] / 2)  # fmt: skip
        ours[size] = rows[0].time_us
    dev = device()
    store = dist.HashStore()  # one rank: an in-process store, no file left behind
    dist.init_process_group(backend, store=store, rank=0, world_size=1)
    plain = {}
    for size in cfg.collective_sizes:
        buf = torch.ones(size // 4, dtype=torch.float32, device=dev)
        for _ in range(warmup):
            dist.all_reduce(buf)
        synchronize()
        started = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(buf)
        synchronize()
        plain[size] = (time.perf_counter() - started) / iters * 1e6
    dist.destroy_process_group()
    rows = [[size, round(ours[size], 2), round(plain[size], 2), round(size / ours[size] / 1e3, 3),
             ratio(ours[size], plain[size])] for size in cfg.collective_sizes]  # fmt: skip
    return {
        "backend": backend, "world_size": 1, "iters": iters,
        "note": "bus bandwidth is 0 by definition at world size 1 (factor 2(n-1)/n); algbw and time compared. "
                "trainjob's benchmark times the out-of-place form (a copy plus the in-place all_reduce)",
        "trainjob_time_us": ours, "plain_time_us": plain,
        "table": table(["bytes", "trainjob us", "plain us", "trainjob algbw GB/s", "ratio trainjob/plain (time)"],
                       rows),
    }  # fmt: skip


# -- step 4: checkpoint ---------------------------------------------------------------------------------------


def step_checkpoint(cfg: Config) -> Result:
    """Save and load ``ckpt_bytes`` of float32 parameters: trainjob's Checkpointer (sync and async) against
    ``torch.save``/``torch.load`` of the same state dict."""
    import torch
    from torch import nn

    import trainjob.torch as tt

    tt.init()
    dev = device()
    chunk = min(cfg.ckpt_bytes, 256 << 20) // 4
    model = nn.ParameterList(
        [nn.Parameter(torch.randn(chunk, device=dev)) for _ in range(max(1, cfg.ckpt_bytes // (chunk * 4)))]
    )
    state_bytes = sum(p.numel() * 4 for p in model.parameters())
    root = Path(tempfile.mkdtemp(prefix="gpu-bench-ckpt-"))
    timings: dict[str, float] = {}

    def timed(name: str, fn: Callable[[], Any]) -> None:
        synchronize()
        started = time.perf_counter()
        fn()
        synchronize()
        timings[name] = round(time.perf_counter() - started, 4)

    timed("torch_save", lambda: torch.save(model.state_dict(), root / "plain.pt"))
    sync = tt.Checkpointer(root / "sync", keep_last=1)
    timed("trainjob_save_sync", lambda: sync.save(1, model))
    async_ckpt = tt.Checkpointer(root / "async", keep_last=1, async_save=True)
    timed("trainjob_save_async_blocked", lambda: async_ckpt.save(1, model))
    timed("trainjob_save_async_wait", async_ckpt.wait)
    timings["trainjob_save_async_total"] = round(
        timings["trainjob_save_async_blocked"] + timings["trainjob_save_async_wait"], 4
    )
    timed("torch_load", lambda: model.load_state_dict(torch.load(root / "plain.pt", map_location=dev)))
    timed("trainjob_load", lambda: sync.load(model))
    rows = [
        ["save (sync)", timings["trainjob_save_sync"], timings["torch_save"],
         ratio(timings["trainjob_save_sync"], timings["torch_save"])],
        ["save (async), loop blocked", timings["trainjob_save_async_blocked"], timings["torch_save"],
         ratio(timings["trainjob_save_async_blocked"], timings["torch_save"])],
        ["save (async), until on disk", timings["trainjob_save_async_total"], timings["torch_save"],
         ratio(timings["trainjob_save_async_total"], timings["torch_save"])],
        ["load", timings["trainjob_load"], timings["torch_load"],
         ratio(timings["trainjob_load"], timings["torch_load"])],
    ]  # fmt: skip
    import shutil

    shutil.rmtree(root, ignore_errors=True)
    return {
        "state_bytes": state_bytes, "device": dev.type, "seconds": timings,
        "note": "one try each, files in the page cache for the loads",
        "table": table(["operation", "trainjob s", "torch.save/load s", "ratio trainjob/torch"], rows),
    }  # fmt: skip


# -- step 5: planner ------------------------------------------------------------------------------------------


def step_planner(cfg: Config, throughput: Result | None = None) -> Result:
    """trainjob's memory plan of the throughput model against the peak memory its variants measured."""
    from trainjob.tools.sizing.memory import estimate_memory
    from trainjob.tools.training_setup import TrainingSetup

    variants = (throughput or {}).get("variants", {})
    rows, plans = [], {}
    for variant, checkpointing in (("eager", False), ("ac", True)):
        measured = variants.get(variant, {})
        params = measured.get("params")
        setup = TrainingSetup(params=params, gpus=1, zero=3, dtype="bf16", optimizer="adamw", layers=cfg.layers,
                              hidden=cfg.dim, heads=cfg.heads, seq=cfg.seq, vocab=cfg.vocab, micro_batch=cfg.batch,
                              activation_checkpointing=checkpointing, flash_attention=not cfg.dry_run)  # fmt: skip
        plan = estimate_memory(setup)
        peak = measured.get("peak_memory_bytes")
        plans[variant] = {"planned_bytes": plan.total, "model_states_bytes": plan.model_states,
                          "activations_bytes": plan.activations_checkpointed if checkpointing else plan.activations,
                          "measured_peak_bytes": peak}  # fmt: skip
        rows.append([variant, round(plan.total / 2**30, 3), round(peak / 2**30, 3) if peak else "n/a",
                     ratio(plan.total, peak)])  # fmt: skip
    note = None
    if cfg.dry_run or not variants:
        note = ("no measured peak: on the CPU torch.cuda.max_memory_allocated is not available"
                if cfg.dry_run else "no measured peak: the throughput step did not run")  # fmt: skip
    return {
        "plans": plans,
        "note": note,
        "table": table(["variant", "planned GiB", "measured peak GiB", "ratio planned/measured"], rows),
    }


# -- the run --------------------------------------------------------------------------------------------------

STEPS = ("env", "throughput", "collectives", "checkpoint", "planner")
CHILDREN: dict[str, Callable[..., Result]] = {
    "env": step_env,
    "train_variant": train_variant,
    "collectives": step_collectives,
    "checkpoint": step_checkpoint,
    "planner": step_planner,
}


def run_step(name: str, cfg: Config, results: dict[str, Result]) -> Result:
    """One step: the throughput step drives its variants' subprocesses itself; the others run in one subprocess."""
    if name == "throughput":
        try:
            return step_throughput(cfg)
        except Exception as exc:  # noqa: BLE001 - recorded, the next step runs
            return {"status": "failed", "error": repr(exc)}
    extra = {"throughput": results.get("throughput")} if name == "planner" else None
    return run_child(name, cfg, cfg.budgets[name], extra)


def to_markdown(report: Result) -> str:
    lines = [f"# GPU benchmark ({'dry run, CPU' if report['dry_run'] else 'GPU'})", "",
             f"Wall time {report['wall_s']} s; steps: {', '.join(report['steps'])}.", ""]  # fmt: skip
    for name, result in report["results"].items():
        lines += [f"## {name}: {result.get('status')}", ""]
        for key in ("reason", "error", "note"):
            if result.get(key):
                lines += [f"{key}: {result[key]}", ""]
        if name == "throughput" and "torchtitan" in result:
            lines += [f"torchtitan: skipped ({result['torchtitan']['reason']})", ""]
        tab = result.get("table")
        if tab:
            lines.append("| " + " | ".join(tab["columns"]) + " |")
            lines.append("|" + "---|" * len(tab["columns"]))
            lines += [
                "| " + " | ".join("" if v is None else str(v) for v in row) + " |" for row in tab["rows"]
            ]
            lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes, torch.compile skipped")
    parser.add_argument("--steps", default=",".join(STEPS), help=f"comma-separated, from {','.join(STEPS)}")
    parser.add_argument("--out", default=os.environ.get("OUT"), help="default: $OUT, else a new temp dir")
    parser.add_argument(
        "--ckpt-gb", type=float, default=None, help="checkpointed state (default 2; dry run 0.008)"
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--child-args", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child_main(args.child, args.child_args)
        return 0
    steps = [s.strip() for s in args.steps.split(",") if s.strip()]
    unknown = sorted(set(steps) - set(STEPS))
    if unknown:
        parser.error(f"unknown steps {unknown}; known: {', '.join(STEPS)}")
    cfg = config(args.dry_run, args.ckpt_gb)
    out = Path(args.out or tempfile.mkdtemp(prefix="gpu-bench-out-"))
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    results: dict[str, Result] = {}
    for name in steps:
        print(f"[gpu-bench] {name} ...", flush=True)
        results[name] = run_step(name, cfg, results)
        print(
            f"[gpu-bench] {name}: {results[name].get('status')} {results[name].get('error') or ''}",
            flush=True,
        )
    report = {"dry_run": cfg.dry_run, "steps": steps, "wall_s": round(time.perf_counter() - started, 1),
              "config": asdict(cfg), "results": results}  # fmt: skip
    (out / "gpu-results.json").write_text(json.dumps(report, indent=2, default=str))
    (out / "gpu-results.md").write_text(to_markdown(report))
    print(f"[gpu-bench] wrote {out / 'gpu-results.json'} and {out / 'gpu-results.md'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
