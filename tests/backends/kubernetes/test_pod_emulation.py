"""The JobSet the operator renders really trains: its pods run as processes on separate network hosts.

Each pod of the rendered JobSet becomes a process in its own network namespace with the environment the kubelet
would give it (``PET_NODE_RANK`` from the completion index) and ``{job}-node-0-0.{job}`` resolving to the first pod,
started with the container's own command (``torchrun``). A two-node DDP training over gloo must complete.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from trainjob.backends.kubernetes.testing.harness import (
    Cluster,
    jobset_condition,
    wait_for,
    wait_for_condition,
)
from trainjob.backends.kubernetes.testing.pods import (
    PodNetwork,
    netns_unavailable_reason,
    pod_specs,
    run_jobset,
)

DDP_SCRIPT = """
import json, os, socket, sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
inputs = torch.randn(64, 8, generator=torch.Generator().manual_seed(rank))  # each rank its own shard
targets = inputs @ torch.arange(8.0)[:, None]
losses = []
for _ in range(40):
    optimizer.zero_grad()
    loss = ((model(inputs) - targets) ** 2).mean()
    loss.backward()
    optimizer.step()
    losses.append(loss.item())
params = torch.cat([p.detach().flatten() for p in model.parameters()])
everyone = [torch.zeros_like(params) for _ in range(world)]
dist.all_gather(everyone, params)
Path(sys.argv[1], f"rank{rank}.json").write_text(json.dumps({
    "rank": rank, "world": world, "node_rank": int(os.environ["GROUP_RANK"]), "host": socket.gethostname(),
    "master": os.environ["MASTER_ADDR"], "first_loss": losses[0], "last_loss": losses[-1],
    "in_sync": all(torch.equal(everyone[0], p) for p in everyone),
}))
dist.barrier()
sys.stdout.flush()
# Leave without the gloo teardown: on this CPU build it sometimes aborts at exit after the work is done.
os._exit(0)
"""


@pytest.mark.netns
@pytest.mark.slow
def test_rendered_jobset_trains_ddp_across_two_pod_hosts(cluster: Cluster, tmp_path: Path) -> None:
    if (reason := netns_unavailable_reason()) is not None:
        pytest.skip(reason)
    script, results = tmp_path / "ddp.py", tmp_path / "results"
    script.write_text(DDP_SCRIPT)
    results.mkdir()
    cluster.create_job(
        "ddp",
        trainer={"numNodes": 2, "numProcPerNode": 1, "command": ["torchrun", str(script), str(results)]},
    )
    jobset = wait_for(lambda: cluster.jobset("ddp"), what="the JobSet")
    assert [(p.hostname, p.env["PET_NODE_RANK"]) for p in pod_specs(jobset)] == [
        ("ddp-node-0-0", "0"),
        ("ddp-node-0-1", "1"),
    ]

    venv_bin = str(Path(sys.executable).parent)  # the container's `torchrun` is this environment's
    with PodNetwork() as network:
        pods = run_jobset(
            jobset, network, tmp_path, extra_env={"PATH": f"{venv_bin}:/usr/bin:/bin"}, timeout=120
        )
        addresses = dict(network.addresses)

    assert [p.returncode for p in pods] == [0, 0], "\n\n".join(p.log[-3000:] for p in pods)
    ranks = [json.loads((results / f"rank{r}.json").read_text()) for r in range(2)]
    assert [(r["world"], r["node_rank"], r["host"]) for r in ranks] == [
        (2, 0, "ddp-node-0-0"),
        (2, 1, "ddp-node-0-1"),
    ]
    assert {r["master"] for r in ranks} == {"ddp-node-0-0.ddp"}
    assert addresses["ddp-node-0-0"] != addresses["ddp-node-0-1"]
    assert all(r["in_sync"] and r["last_loss"] < r["first_loss"] / 10 for r in ranks)

    # Play the JobSet controller reporting the finished Jobs: the TrainJob completes.
    cluster.set_jobset_status(
        "ddp",
        {"conditions": [jobset_condition("Completed", "AllJobsCompleted", "jobset completed successfully")]},
    )
    wait_for_condition(cluster, "ddp", "Complete")


def test_pod_network_cleans_up_after_a_failure(tmp_path: Path) -> None:
    if (reason := netns_unavailable_reason()) is not None:
        pytest.skip(reason)
    import subprocess

    pods = pod_specs(
        {
            "metadata": {"name": "crash"},
            "spec": {
                "replicatedJobs": [
                    {
                        "name": "node",
                        "replicas": 1,
                        "template": {
                            "spec": {
                                "parallelism": 2,
                                "template": {
                                    "spec": {
                                        "containers": [{"name": "node", "command": ["sh", "-c", "exit 3"]}]
                                    }
                                },
                            }
                        },
                    }
                ]
            },
        }
    )
    with pytest.raises(RuntimeError, match="boom"), PodNetwork() as network:
        network.add_pods(pods)
        names = list(network.namespaces)
        raise RuntimeError("boom")

    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(name in listed for name in names)
    assert not any((Path("/etc/netns") / name).exists() for name in names)
    assert subprocess.run(["ip", "link", "show", network.bridge], capture_output=True).returncode != 0
