"""Kill-a-rank trials: is the rank that was killed the one a failed job names?

Each trial runs a 2 nodes x 2 processes gloo job in an all-reduce loop, kills one rank with ``--signal``
(SIGKILL by default: how an OOM kill looks) and checks that the job's failure names that rank, not one of the
ranks that died because of it. Victims cycle through the ranks.

    python benchmarks/root_cause.py --trials 20
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import textwrap
import time
from pathlib import Path

# Test helpers (job resources, process checks) live with the tests.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "harness"))

LOOP = textwrap.dedent("""
    import os, time
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    with open(os.path.join(os.environ["TRAINJOB_JOB_DIR"], f"pid-{dist.get_rank()}"), "w") as f:
        f.write(str(os.getpid()))
    t = torch.ones(1)
    while True:
        dist.all_reduce(t)
        time.sleep(0.01)
""")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--signal", default="SIGKILL")
    args = parser.parse_args()
    sig = signal.Signals[args.signal]

    workdir = Path(tempfile.mkdtemp(prefix="root-cause-"))
    os.environ["TRAINJOB_HOME"] = str(workdir / "home")
    from jobtest.local import trainjob_resource, wait_until

    from trainjob.backends.local.client.backend import LocalBackend
    from trainjob.errors import JobFailedError

    script = workdir / "loop.py"
    script.write_text(LOOP)
    backend = LocalBackend()
    wrong = []
    for trial in range(args.trials):
        victim = trial % 4
        name = f"trial-{trial}"
        backend.apply(trainjob_resource(name, ["torchrun", str(script)], num_nodes=2, num_proc_per_node=2))
        job_dir = backend.store.job_dir(name)
        wait_until(lambda job_dir=job_dir: all((job_dir / f"pid-{r}").exists() for r in range(4)), timeout=300)
        time.sleep(0.5)
        os.kill(int((job_dir / f"pid-{victim}").read_text()), sig)
        try:
            backend.wait_for_job_status(name, timeout=300)
            named = "completed?"
        except JobFailedError as exc:
            named = str(exc).split("NodeFailed: ", 1)[-1]
        expected = f"node-{victim // 2} rank {victim} (local rank {victim % 2})"
        if not named.startswith(expected):
            wrong.append({"trial": trial, "victim": victim, "named": named})
        print(f"trial {trial}: killed rank {victim}, named: {named}", file=sys.stderr, flush=True)
        backend.delete_job(name)
    json.dump({"signal": sig.name, "trials": args.trials, "correct": args.trials - len(wrong), "wrong": wrong},
              sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
