"""The JobSets two controllers render for one wide TrainJob, created by hand with no controller running: how long
their pods take to be Running and the JobSet to be Completed on simulated nodes, by what the pods carry alone.

    python benchmarks/jobset_by_hand.py --json by-hand.json              # 1,000 simulated nodes, 1 x 1,000, 3 rounds
    python benchmarks/jobset_by_hand.py --fake-nodes 50 --rounds 1       # about 5 minutes, to try it

``benchmarks/reconcile.py --kwok`` times each controller driving its TrainJobs; this takes the controllers out.
Each controller (trainjob's operator, then Kubeflow Trainer's, at ``--kubeflow`` releases) renders the JobSet of a
suspended TrainJob of ``--fake-nodes`` nodes and is stopped. Then each rendering below is created unsuspended, in a
namespace of its own, ``--rounds`` times (the order reversed every other round), and the namespace is deleted and
waited for before the next:

- ``trainjob``: trainjob's JobSet as rendered;
- ``kubeflow``: Kubeflow's, with its default feature gates (``TrainJobStatus``, its own status client in the pods,
  is alpha and off in v2.3.0; its status server needs to run in a pod, so it is not measured here);
- ``trainjob-bare``: trainjob's without what its status client adds to every pod (the projected token and files,
  the endpoint's variables, the CA annotation, ``TRAINJOB_STALL_DUMP``);
- ``kubeflow-padded``: Kubeflow's with a pod annotation as long as what trainjob's pod template has more (a
  difference that comes from bytes alone shows here);
- with ``--paddings 500,1000``, also ``kubeflow+500``, ``kubeflow+1000``: Kubeflow's padded by that many bytes, to
  see how the time grows with a pod's size.

Figures per run, from the JobSet's create: ``running`` (the latest pod ``status.startTime``), ``complete`` (the
JobSet's ``Completed`` condition), ``created`` (the latest pod's ``creationTimestamp``), whole seconds each, and
``pod bytes``, a finished pod's JSON as the API server returns it (managed fields and status included); the medians
by rendering, and the ratios of each to ``kubeflow``. The pod template's JSON size is printed beside them.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "harness"))

import reconcile_kwok as kwok_bench  # noqa: E402  (beside this file)
from compare import report  # noqa: E402
from kubetest.cluster import TrainJobCluster  # noqa: E402
from kubetest.controlplane import RELEASES_ENV, ControlPlane  # noqa: E402
from kubetest.kwok import SimulatedNodes, on_simulated_nodes  # noqa: E402

from trainjob.backends.kubernetes import status_server  # noqa: E402
from trainjob.backends.kubernetes.resources import JOBSETS, TRAINJOBS  # noqa: E402
from trainjob.constants import STALL_DUMP_ENV  # noqa: E402

#: What the status client adds to each container's environment.
STATUS_CLIENT_ENV = {status_server.URL_ENV, status_server.TOKEN_ENV, status_server.CA_CERT_ENV,
                     status_server.COLLECTIVES_URL_ENV, STALL_DUMP_ENV}


def pod_templates(jobset: dict[str, Any]) -> list[dict[str, Any]]:
    return [rj["template"]["spec"]["template"] for rj in jobset["spec"]["replicatedJobs"]]


def without_status_client(jobset: dict[str, Any]) -> dict[str, Any]:
    """``jobset`` less what :func:`status_server.inject_status_client` (and the stall setting) put in its pods."""
    jobset = copy.deepcopy(jobset)
    for template in pod_templates(jobset):
        pod = template["spec"]
        _keep(pod, "volumes", lambda volume: volume.get("name") != status_server.VOLUME)
        for container in [*(pod.get("initContainers") or []), *pod["containers"]]:
            _keep(container, "env", lambda var: var["name"] not in STATUS_CLIENT_ENV)
            _keep(container, "volumeMounts", lambda mount: mount.get("name") != status_server.VOLUME)
    return jobset


def _keep(obj: dict[str, Any], key: str, keep: Callable[[dict[str, Any]], bool]) -> None:
    """Keep the items of ``obj[key]`` that ``keep`` accepts; no key when none is left."""
    kept = [item for item in obj.get(key) or [] if keep(item)]
    if kept:
        obj[key] = kept
    else:
        obj.pop(key, None)


def padded(jobset: dict[str, Any], length: int) -> dict[str, Any]:
    """``jobset`` whose pod templates carry one more annotation, ``length`` characters long."""
    jobset = copy.deepcopy(jobset)
    for template in pod_templates(jobset):
        template.setdefault("metadata", {}).setdefault("annotations", {})["benchmark/padding"] = "x" * max(length, 0)
    return jobset


def grown(jobset: dict[str, Any], by: int) -> dict[str, Any]:
    """``jobset`` :func:`padded` so that its first pod template is ``by`` bytes longer (the annotation's key and
    quotes count)."""
    overhead = size(padded(jobset, 0)) - size(jobset)
    return padded(jobset, by - overhead)


def size(jobset: dict[str, Any]) -> int:
    return len(json.dumps(pod_templates(jobset)[0], separators=(",", ":")))


def capture(cluster: TrainJobCluster, controller: kwok_bench.Controller, nodes: int) -> dict[str, Any]:
    """The JobSet ``controller`` renders for a suspended TrainJob of ``nodes`` nodes."""
    cp, api = cluster.cp, cluster.api
    namespace = f"render-{controller.name}"
    cp.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}])
    cluster.namespaced_runtime(namespace, kwok_bench.RUNTIME, on_simulated_nodes)
    controller.start()
    try:
        kwok_bench.wait_admitted(api, kwok_bench.job_body("webhook-probe", namespace, nodes))
        body = kwok_bench.job_body("wide", namespace, nodes)
        body["spec"]["suspend"] = True
        api.create(body, TRAINJOBS)
        deadline = time.monotonic() + 120
        while not api.list(JOBSETS, namespace):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{controller.name} rendered no JobSet in 120 s")
            time.sleep(0.5)
        time.sleep(2)  # a controller that writes its JobSet twice has done so
        jobset = api.list(JOBSETS, namespace)[0]
    finally:
        controller.stop()
    kwok_bench.delete_namespace(api, namespace)
    return jobset


def by_hand(cluster: TrainJobCluster, jobset: dict[str, Any], namespace: str, timeout: float) -> dict[str, float]:
    """Create ``jobset`` (unsuspended, without its owner) in a new ``namespace``; its figures."""
    cp, api = cluster.cp, cluster.api
    cp.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}])
    meta = jobset["metadata"]
    body = {**copy.deepcopy(jobset), "metadata": {"name": meta["name"], "namespace": namespace,
                                                  "labels": meta.get("labels") or {}}}
    body.pop("status", None)
    body["spec"]["suspend"] = False
    start = time.time()
    api.create(body, JOBSETS)
    deadline = time.monotonic() + timeout
    while True:
        current = api.list(JOBSETS, namespace)[0]
        done = kwok_bench.condition_true(current, "Completed")
        if done:
            break
        failed = kwok_bench.condition_true(current, "Failed")
        if failed:
            raise RuntimeError(f"JobSet failed: {failed}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"JobSet not Completed after {timeout:g} s")
        time.sleep(1)
    pods = api.list_pods(namespace, "jobset.sigs.k8s.io/jobset-name")
    figures = {
        "running_s": max(kwok_bench.seconds_after(p["status"]["startTime"], start) for p in pods),
        "complete_s": kwok_bench.seconds_after(done, start),
        "created_s": max(kwok_bench.seconds_after(p["metadata"]["creationTimestamp"], start) for p in pods),
        # what every watcher of pods gets, per pod and per change: the object as the API server keeps it
        "pod_bytes": statistics.mean(len(json.dumps(p, separators=(",", ":"))) for p in pods),
    }
    kwok_bench.delete_namespace(api, namespace)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fake-nodes", type=int, default=1000, help="simulated nodes, and the job's nodes")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--run-seconds", type=float, default=2.0, help="how long a simulated pod runs")
    parser.add_argument("--client-qps", type=int, default=500)
    parser.add_argument("--kubeflow", choices=("pinned", "current"), default="current")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--json", type=Path, metavar="PATH")
    parser.add_argument("--paddings", default="", metavar="N,N",
                        help="also Kubeflow's JobSet with pod templates this many bytes longer, each")
    parser.add_argument("--renderings", default="", metavar="NAME,NAME",
                        help="time only these renderings (default all)")
    args = parser.parse_args()
    try:
        paddings = [int(n) for n in filter(None, args.paddings.split(","))]
    except ValueError:
        parser.error(f"--paddings {args.paddings!r}: whole numbers of bytes, comma-separated (500,1000)")
    known = {"trainjob", "kubeflow", "trainjob-bare", "kubeflow-padded", *(f"kubeflow+{n}" for n in paddings)}
    chosen = args.renderings.split(",") if args.renderings else []
    if set(chosen) - known or (chosen and "kubeflow" not in chosen):
        parser.error(f"--renderings {args.renderings!r}: name kubeflow (the ratios' base) and any of "
                     f"{', '.join(sorted(known))}")
    os.environ[RELEASES_ENV] = args.kubeflow
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp, \
            ControlPlane.start(Path(tmp) / "cluster", client_qps=args.client_qps, nodes=0) as cp:
        cluster = TrainJobCluster(cp, Path(tmp))
        kwok_bench.install(cluster)
        kwok_bench.wait_admitted(cluster.api, kwok_bench.PROBE_JOBSET)
        with SimulatedNodes.start(cp, run_seconds=args.run_seconds, log_level="WARN", delete_on_stop=False) as kwok:
            kwok.add_nodes(args.fake_nodes, timeout=600)
            operator = kwok_bench.TrainJobOperator(cluster, workers=4)
            kwok_bench.first_start_rss(operator)  # its TLS Secret exists, as on a cluster it ran on before
            ours = capture(cluster, operator, args.fake_nodes)
            theirs = capture(cluster, kwok_bench.Kubeflow(cp), args.fake_nodes)
            renderings = {"trainjob": ours, "kubeflow": theirs, "trainjob-bare": without_status_client(ours),
                          "kubeflow-padded": grown(theirs, size(ours) - size(theirs))}
            for extra in paddings:
                renderings[f"kubeflow+{extra}"] = grown(theirs, extra)
            if args.renderings:
                renderings = {name: renderings[name] for name in chosen}
            sizes = {name: size(js) for name, js in renderings.items()}
            print(f"{args.fake_nodes} simulated nodes; control plane {cp.components['versions']}; pod template "
                  "bytes: " + ", ".join(f"{name} {n}" for name, n in sizes.items()), flush=True)
            for round_ in range(args.rounds):
                order = list(renderings) if round_ % 2 == 0 else list(reversed(renderings))
                for name in order:
                    figures = by_hand(cluster, renderings[name], f"r{round_}-{name.replace('+', '-plus-')}", args.timeout)
                    runs.append({"rendering": name, "round": round_ + 1, **figures})
                    print(f"  round {round_ + 1} {name:16} " + "  ".join(f"{k} {v:5.1f}" for k, v in figures.items()),
                          flush=True)
    medians = {name: {k: statistics.median(r[k] for r in runs if r["rendering"] == name)
                      for k in ("running_s", "complete_s", "created_s", "pod_bytes")} | {"pod_template_bytes": sizes[name]}
               for name in renderings}
    print(f"{'rendering':16} {'template':>8} {'pod':>6} {'running':>8} {'complete':>9} {'vs kubeflow':>12}")
    for name, m in medians.items():
        print(f"{name:16} {m['pod_template_bytes']:8} {m['pod_bytes']:6.0f} {m['running_s']:8.1f} {m['complete_s']:9.1f} "
              f"{m['complete_s'] / medians['kubeflow']['complete_s']:11.2f}x")
    report({"fake_nodes": args.fake_nodes, "rounds": args.rounds, "runs": runs, **medians,
            "ratio": {name: {k: m[k] / medians["kubeflow"][k] for k in ("running_s", "complete_s")}
                      for name, m in medians.items()}}, args.json)


if __name__ == "__main__":
    main()
