"""Download throughput of trainjob's initializer against the clients used alone, and the cost of a cache hit.

One run fills a source of ``--size-mb`` MiB (default 1024) laid out as a model or dataset is: a few large files
(8 ``model-0000N-of-00008.safetensors``, half the bytes), many small ones (64 ``data/train-000NN-of-00064.parquet``,
the other half) and three tiny ones (``config.json``, ``tokenizer.json``, ``README.md``), of random bytes. The same
files are served two ways, both on 127.0.0.1:

- **S3**: uploaded once (one ``PutObject`` each, so every ETag is the object's MD5 and trainjob checks it) to a
  local VersityGW (``tests/harness/objectstore/s3.py``, built from its Go module). Baseline: boto3 alone, a
  client made, the prefix listed, and ``download_file`` per object (default ``TransferConfig``: ranged GETs of
  8 MiB for large objects, 10 threads each) through a ``ThreadPoolExecutor`` as wide as trainjob's
  ``PARALLEL_FILES``; its client's connection pool is wide enough for all those threads, so the baseline is not
  held back by discarded connections. trainjob: ``initialize()`` of a ``dataset`` config from the same
  environment a job's initializer gets (``STORAGE_URI``, ``ENDPOINT``, keys, ``REGION``, a fresh
  ``TRAINJOB_INITIALIZER_TARGET`` each run, no cache). Where the AWS CLI is importable (``awscli``), ``aws s3 cp
  --recursive`` is timed too; otherwise that row says it was skipped.
- **Hub**: a model repository of the ``HubServer`` (``tests/harness/objectstore/hub.py``). Baseline:
  ``huggingface_hub.snapshot_download(local_dir=<fresh>, endpoint=...)``; trainjob: ``initialize()`` of a
  ``model`` config with ``ALLOW_PATTERNS=*`` (nothing filtered) and ``HF_ENDPOINT``. The Hub server is a thread
  of this process, so both sides share the GIL with it: that slows both alike, and the absolute MB/s are lower
  than a real Hub's would be.

``--runs`` (default 3) interleaved runs each (baseline, trainjob; the next run trainjob first), a ``sync`` before
each so one side's write-back does not fall on the other. The figures are the median MB/s (decimal megabytes)
of each and the median, over runs, of trainjob's rate over the baseline's in the same run (target: at least
0.9 for both sources; it pays for checking every file against the source's checksum, which the clients alone do
not do).

**Cache hit**: with ``TRAINJOB_INITIALIZER_CACHE`` set and the entry already there (filled by one download,
timed as ``fill_s``), an initializer lists the source and hard-links the entry's files into a fresh target.
``in_process_s`` is ``initialize()`` doing that, for each source; ``command_s`` is ``python -m
trainjob.initializers dataset`` doing it as a process, start-up and imports included, as a job runs it before its
nodes. Target: a job whose initializer hits the cache reaches its first ``init_process_group`` at most 1 s later
than one with no initializer; these are the initializer's part of that second.

**Jobs**: the whole of it, on the local backend: from ``TrainerClient.train()`` to rank 0 reaching
``init_process_group`` (it writes the time), for a job with no initializer and one whose model initializer hits
the machine's cache (filled by an untimed job first), ``--runs`` of each interleaved; ``added_s`` is the difference
of the medians.

A Markdown table is printed; ``--json PATH`` also writes the figures (``benchmarks/compare.py`` reads them). Temporary
files go under ``--work-dir`` (default: the system's temp folder), about three times ``--size-mb`` at once::

    python benchmarks/initializers.py                                  # 1 GiB, 3 runs
    python benchmarks/initializers.py --size-mb 256 --runs 5 --json /tmp/init.json --work-dir /mnt/big
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
HARNESS = REPO / "tests" / "harness"
MiB = 1 << 20
BUCKET = "bench"
PREFIX = "dataset"
REPO_ID = "bench/model"
LARGE_FILES = 8
SMALL_FILES = 64
TINY = {"config.json": 700, "tokenizer.json": 9000, "README.md": 1500}
SEED = 20240611


def layout(size_mb: int) -> list[tuple[str, int]]:
    """``(path, bytes)`` of the source's files: the tiny ones, then 8 large ones holding about half of
    ``size_mb`` MiB and 64 small ones the rest; the sizes add up to ``size_mb`` MiB exactly."""
    total = size_mb * MiB
    tiny = sum(TINY.values())
    if total < 2 * tiny:
        raise ValueError(f"--size-mb {size_mb}: too small for the layout")
    rest = total - tiny
    large = rest // 2 // LARGE_FILES
    small = (rest - large * LARGE_FILES) // SMALL_FILES
    files = list(TINY.items())
    files += [(f"model-{i:05d}-of-{LARGE_FILES:05d}.safetensors", large) for i in range(1, LARGE_FILES + 1)]
    files += [(f"data/train-{i:05d}-of-{SMALL_FILES:05d}.parquet", small) for i in range(SMALL_FILES)]
    last, size = files[-1]
    files[-1] = (last, size + total - sum(size for _, size in files))
    return files


def write_source(folder: Path, files: list[tuple[str, int]]) -> None:
    """The files, of random bytes (the same each run of this script)."""
    rng = random.Random(SEED)
    for name, size in files:
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as handle:
            left = size
            while left:
                step = min(left, 8 * MiB)
                handle.write(rng.randbytes(step))
                left -= step


def check_tree(folder: Path, files: list[tuple[str, int]], who: str) -> None:
    """Every file arrived with its size (the content is the download's own business: trainjob checks it)."""
    for name, size in files:
        path = folder / name
        if not path.is_file() or path.stat().st_size != size:
            found = path.stat().st_size if path.is_file() else "missing"
            raise RuntimeError(f"{who}: {name} has {found}, expected {size} bytes")


def timed(call: Callable[[], object]) -> float:
    """Seconds ``call`` takes, after a ``sync`` (not timed) so earlier writes are on disk first."""
    os.sync()
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def remove(path: Path) -> None:
    from trainjob.initializers.transfer import remove_tree

    remove_tree(path)


# the baselines


def s3_baseline(endpoint: str, keys: tuple[str, str], dest: Path, width: int) -> None:
    """boto3 alone: a client, the listing, ``download_file`` per object, ``width`` objects at once."""
    import boto3
    from boto3.s3.transfer import TransferConfig
    from botocore.config import Config

    transfer = TransferConfig()
    client = boto3.session.Session().client(
        "s3", endpoint_url=endpoint, aws_access_key_id=keys[0], aws_secret_access_key=keys[1], region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"},
                      max_pool_connections=width * transfer.max_request_concurrency))
    objects = [item["Key"] for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=PREFIX)
               for item in page.get("Contents") or []]

    def one(key: str) -> None:
        path = dest / key[len(PREFIX):].lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        client.download_file(BUCKET, key, str(path), Config=transfer)

    with ThreadPoolExecutor(max_workers=width) as pool:
        list(pool.map(one, objects))
    client.close()


def aws_cli_baseline(env: dict[str, str], dest: Path) -> None:
    subprocess.run([sys.executable, "-m", "awscli", "s3", "cp", "--recursive", "--quiet", "--only-show-errors",
                    f"s3://{BUCKET}/{PREFIX}", str(dest)], env=env, check=True, stdin=subprocess.DEVNULL)


def hub_baseline(endpoint: str, dest: Path) -> None:
    from huggingface_hub import snapshot_download

    snapshot_download(REPO_ID, repo_type="model", local_dir=dest, endpoint=endpoint)


# trainjob


def s3_env(server: Any, target: Path, cache: Path | None = None) -> dict[str, str]:
    env = {"STORAGE_URI": f"s3://{BUCKET}/{PREFIX}", "ENDPOINT": server.endpoint, "ACCESS_KEY_ID": server.access_key,
           "SECRET_ACCESS_KEY": server.secret_key, "REGION": server.region, "TRAINJOB_INITIALIZER_TARGET": str(target)}
    if cache is not None:
        env["TRAINJOB_INITIALIZER_CACHE"] = str(cache)
    return env


def hub_env(endpoint: str, target: Path, cache: Path | None = None) -> dict[str, str]:
    env = {"STORAGE_URI": f"hf://{REPO_ID}", "HF_ENDPOINT": endpoint, "ALLOW_PATTERNS": "*",
           "TRAINJOB_INITIALIZER_TARGET": str(target)}
    if cache is not None:
        env["TRAINJOB_INITIALIZER_CACHE"] = str(cache)
    return env


def trainjob_initialize(kind: str, env: dict[str, str], expect: str) -> None:
    from trainjob.initializers.config import InitializerConfig
    from trainjob.initializers.run import initialize

    lines: list[str] = []
    try:
        outcome = initialize(InitializerConfig.from_env(kind, env), log=lines.append)
    except BaseException:
        print("\n".join(lines), file=sys.stderr)
        raise
    if outcome.how != expect:
        raise RuntimeError(f"trainjob's {kind} initializer {outcome.how} the files, expected {expect}: {lines}")


# the runs


@contextlib.contextmanager
def work_folder(parent: Path | None) -> Iterator[Path]:
    if parent is not None:
        parent.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="trainjob-bench-initializers-", dir=parent))
    try:
        yield folder
    finally:
        remove(folder)


def rate(total: int, seconds: float) -> float:
    return total / seconds / 1e6


def pairs(total: int, baseline: list[float], ours: list[float], label: str) -> dict[str, Any]:
    ratios = [b / t for b, t in zip(baseline, ours, strict=True)]  # rate ratio: trainjob's rate / the baseline's
    return {
        "baseline": label,
        "baseline_mb_s": rate(total, statistics.median(baseline)),
        "trainjob_mb_s": rate(total, statistics.median(ours)),
        "ratio": statistics.median(ratios),
        "baseline_s": statistics.median(baseline),
        "trainjob_s": statistics.median(ours),
        "baseline_runs_s": baseline,
        "trainjob_runs_s": ours,
    }


def measure(size_mb: int, runs: int, work: Path) -> dict[str, Any]:
    if str(HARNESS) not in sys.path:
        sys.path.insert(0, str(HARNESS))
    from huggingface_hub.utils import disable_progress_bars
    from objectstore.hub import HubServer
    from objectstore.s3 import S3Server

    from trainjob.initializers import s3 as trainjob_s3

    disable_progress_bars()  # trainjob's Hub source does this too; done first so the baseline's first run matches
    files = layout(size_mb)
    total = sum(size for _, size in files)
    source = work / "source"
    write_source(source, files)
    width = trainjob_s3.PARALLEL_FILES
    times: dict[str, list[float]] = {"s3_baseline": [], "s3_trainjob": [], "aws_cli": [], "hub_baseline": [],
                                     "hub_trainjob": []}
    has_aws_cli = importlib.util.find_spec("awscli") is not None
    cache = work / "cache"
    hits: dict[str, list[float]] = {"s3_in_process": [], "hub_in_process": [], "s3_command": []}
    fill: dict[str, float] = {}
    with S3Server(directory=work / "s3") as server, HubServer() as hub:
        server.make_bucket(BUCKET)
        client = server.client()
        with ThreadPoolExecutor(max_workers=4) as pool:
            list(pool.map(lambda f: client.put_object(Bucket=BUCKET, Key=f"{PREFIX}/{f[0]}",
                                                      Body=(source / f[0]).read_bytes()), files))
        hub.add_repo(REPO_ID, source)
        remove(source)
        keys = (server.access_key, server.secret_key)
        cli_env = {**os.environ, **server.client_env()}
        s3_sides: dict[str, Callable[[Path], object]] = {
            "s3_baseline": lambda dest: s3_baseline(server.endpoint, keys, dest, width),
            "s3_trainjob": lambda dest: trainjob_initialize("dataset", s3_env(server, dest), "downloaded"),
        }
        if has_aws_cli:
            s3_sides["aws_cli"] = lambda dest: aws_cli_baseline(cli_env, dest)
        hub_sides: dict[str, Callable[[Path], object]] = {
            "hub_baseline": lambda dest: hub_baseline(hub.endpoint, dest),
            "hub_trainjob": lambda dest: trainjob_initialize("model", hub_env(hub.endpoint, dest), "downloaded"),
        }
        for run in range(runs):
            for sides in (s3_sides, hub_sides):
                order = list(sides) if run % 2 == 0 else list(reversed(sides))
                for name in order:  # interleaved, the first side alternating
                    dest = work / f"run-{run}-{name}" / "target"
                    dest.parent.mkdir(parents=True)
                    times[name].append(timed(partial(sides[name], dest)))
                    check_tree(dest, files, name)
                    remove(dest.parent)
        # the cache: filled once by a download, then hit by each run with a fresh target
        configs = {"s3": ("dataset", partial(s3_env, server)), "hub": ("model", partial(hub_env, hub.endpoint))}
        for name, (kind, env_of) in configs.items():
            fill[name] = timed(partial(trainjob_initialize, kind, env_of(work / f"fill-{name}" / "target", cache),
                                       "downloaded"))
            for run in range(runs):
                target = work / f"hit-{name}-{run}" / "target"
                hits[f"{name}_in_process"].append(timed(partial(trainjob_initialize, kind, env_of(target, cache),
                                                                "cached")))
                check_tree(target, files, f"{name} cache hit")
                remove(target.parent)
        command = [sys.executable, "-m", "trainjob.initializers", "dataset"]
        for run in range(runs):
            target = work / f"hit-command-{run}" / "target"
            env = {**os.environ, **s3_env(server, target, cache)}
            hits["s3_command"].append(timed(partial(subprocess.run, command, env=env, check=True,
                                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                                    stderr=subprocess.PIPE)))
            check_tree(target, files, "cache hit command")
            remove(target.parent)
        jobs = first_init_delays(hub.endpoint, runs, work)
    results: dict[str, Any] = {
        "size_mb": size_mb, "files": len(files), "bytes": total, "runs": runs, "parallel_files": width,
        "s3": pairs(total, times["s3_baseline"], times["s3_trainjob"],
                    f"boto3 download_file, {width} objects at once"),
        "hub": pairs(total, times["hub_baseline"], times["hub_trainjob"], "huggingface_hub snapshot_download"),
        "cache_hit": {
            "s3_in_process_s": statistics.median(hits["s3_in_process"]),
            "hub_in_process_s": statistics.median(hits["hub_in_process"]),
            "s3_command_s": statistics.median(hits["s3_command"]),
            "s3_fill_s": fill["s3"],
            "hub_fill_s": fill["hub"],
            "s3_in_process_runs_s": hits["s3_in_process"],
            "hub_in_process_runs_s": hits["hub_in_process"],
            "s3_command_runs_s": hits["s3_command"],
        },
        "jobs": jobs,
    }
    if has_aws_cli:
        results["aws_cli"] = pairs(total, times["aws_cli"], times["s3_trainjob"], "aws s3 cp --recursive")
    else:
        results["aws_cli"] = {"skipped": "awscli is not installed (pip install awscli to time `aws s3 cp`)"}
    return results


def mark_first_init(path: str) -> None:
    """A CustomTrainer's function: rank 0 writes the time it reaches ``init_process_group``."""
    import os
    import time

    if os.environ.get("RANK", "0") == "0":
        with open(path, "w") as handle:
            handle.write(repr(time.time()))
    import torch.distributed as dist

    dist.init_process_group("gloo")
    dist.destroy_process_group()


def first_init_delays(hub_endpoint: str, runs: int, work: Path) -> dict[str, Any]:
    """Jobs on the local backend, from ``train()`` to rank 0's ``init_process_group``: one with no initializer
    against one whose model initializer hits the machine's cache (filled by an untimed job first), interleaved."""
    from trainjob import (
        CustomTrainer,
        HuggingFaceModelInitializer,
        Initializer,
        LocalProcessBackendConfig,
        TrainerClient,
    )

    saved = {k: os.environ.get(k) for k in ("HF_ENDPOINT", "HF_HOME")}
    os.environ.update(HF_ENDPOINT=hub_endpoint, HF_HOME=str(work / "hf-home"))  # what a job's initializer gets
    client = TrainerClient(LocalProcessBackendConfig(home=work / "home"))
    model = Initializer(model=HuggingFaceModelInitializer(storage_uri=f"hf://{REPO_ID}", ignore_patterns=[]))
    (work / "marks").mkdir()

    marks = iter(range(1 << 30))

    def job(initializer: Initializer | None) -> float:
        mark = work / "marks" / f"{next(marks)}"
        started = time.time()
        name = client.train(initializer=initializer, trainer=CustomTrainer(
            func=mark_first_init, func_args={"path": str(mark)}))
        client.wait_for_job_status(name, timeout=600, polling_interval=0.2)
        client.delete_job(name)
        return float(mark.read_text()) - started

    delays: dict[str, list[float]] = {"plain": [], "cached": []}
    try:
        job(model)  # fills the cache
        job(None)  # warms the page cache for torch's import
        for run in range(runs):
            order = ("plain", "cached") if run % 2 == 0 else ("cached", "plain")
            for side in order:
                delays[side].append(job(model if side == "cached" else None))
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    plain, cached = statistics.median(delays["plain"]), statistics.median(delays["cached"])
    return {"plain_s": plain, "cached_s": cached, "added_s": cached - plain, "plain_runs_s": delays["plain"],
            "cached_runs_s": delays["cached"]}


def table(results: dict[str, Any]) -> str:
    """The figures as a Markdown table."""
    runs = results["runs"]
    size = f"{results['bytes'] / 1e6:.1f} MB in {results['files']} files"
    lines = [f"Initializer downloads: {size}, median of {runs} interleaved run{'s' * (runs != 1)}", "",
             "| source | baseline | baseline MB/s | trainjob MB/s | trainjob / baseline | target |",
             "|---|---|---:|---:|---:|---|"]
    for key, name in (("s3", "S3 (VersityGW)"), ("aws_cli", "S3 (VersityGW)"), ("hub", "Hub (in-process server)")):
        row = results[key]
        if "skipped" in row:
            lines.append(f"| {name} | aws s3 cp --recursive | skipped: {row['skipped']} | | | |")
            continue
        target = ">= 0.9" if key != "aws_cli" else ""
        lines.append(f"| {name} | {row['baseline']} | {row['baseline_mb_s']:.1f} | {row['trainjob_mb_s']:.1f} | "
                     f"{row['ratio']:.2f} | {target} |")
    hit = results["cache_hit"]
    lines += ["", "| cache hit (entry there: list + hard links) | seconds | target |", "|---|---:|---|",
              f"| S3, `initialize()` in process | {hit['s3_in_process_s']:.3f} | part of <= 1 s |",
              f"| Hub, `initialize()` in process | {hit['hub_in_process_s']:.3f} | part of <= 1 s |",
              f"| S3, `python -m trainjob.initializers dataset` | {hit['s3_command_s']:.3f} | part of <= 1 s |",
              f"| (filling the cache: S3 download / Hub download) | {hit['s3_fill_s']:.2f} / {hit['hub_fill_s']:.2f} | |"]
    jobs = results["jobs"]
    lines += ["", "| local job, `train()` to rank 0's `init_process_group` | seconds | target |", "|---|---:|---|",
              f"| no initializer | {jobs['plain_s']:.2f} | |",
              f"| model initializer, cache hit | {jobs['cached_s']:.2f} | |",
              f"| added by the initializer | {jobs['added_s']:.2f} | <= 1 s |"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1024, help="MiB of files to download (default 1024)")
    parser.add_argument("--runs", type=int, default=3, help="interleaved runs of each side (default 3)")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    parser.add_argument("--work-dir", type=Path, help="where the temporary files go (default: the temp folder)")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs: at least 1")
    try:
        layout(args.size_mb)
    except ValueError as exc:
        parser.error(str(exc))
    with work_folder(args.work_dir) as work:
        results = measure(args.size_mb, args.runs, work)
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps({"initializers": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
