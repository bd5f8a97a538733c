"""A TrainJob in today's Kubeflow Trainer shape (v2.2/v2.3: ``torch: {}`` runtime, integer
``trainer.numProcPerNode``, ``runtimePatches``, ``activeDeadlineSeconds``) runs locally as its v2.1 equivalent does
(``numProcPerNode`` on the runtime, ``podTemplateOverrides``)."""

from __future__ import annotations

import json
import textwrap

from trainjob.api import load_resources

RUNTIMES = """
apiVersion: trainer.kubeflow.org/v1alpha1
kind: ClusterTrainingRuntime
metadata: {name: torch-v23}
spec:
  mlPolicy: {numNodes: 1, torch: {}}
  template:
    spec:
      replicatedJobs:
        - name: node
          template:
            metadata: {labels: {trainer.kubeflow.org/trainjob-ancestor-step: trainer}}
            spec: {template: {spec: {containers: [{name: node, image: pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime}]}}}
---
apiVersion: trainer.kubeflow.org/v1alpha1
kind: ClusterTrainingRuntime
metadata: {name: torch-v21}
spec:
  mlPolicy: {numNodes: 1, torch: {numProcPerNode: 2}}
  template:
    spec:
      replicatedJobs:
        - name: node
          template:
            metadata: {labels: {trainer.kubeflow.org/trainjob-ancestor-step: trainer}}
            spec: {template: {spec: {containers: [{name: node, image: pytorch/pytorch:2.7.1-cuda12.8-cudnn9-runtime}]}}}
"""

JOBS = """
apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainJob
metadata: {{name: today}}
spec:
  runtimeRef: {{name: torch-v23}}
  activeDeadlineSeconds: 600
  trainer: {{numNodes: 2, numProcPerNode: 2, command: [torchrun, {probe}]}}
  runtimePatches:
    - manager: trainer.kubeflow.org/kubeflow-sdk
      trainingRuntimeSpec:
        template:
          spec:
            replicatedJobs:
              - name: node
                template:
                  spec:
                    template:
                      spec:
                        containers: [{{name: node, env: [{{name: MODE, value: patched}}]}}]
---
apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainJob
metadata: {{name: seeds}}
spec:
  runtimeRef: {{name: torch-v21}}
  trainer: {{numNodes: 2, command: [torchrun, {probe}]}}
  podTemplateOverrides:
    - targetJobs: [{{name: node}}]
      spec: {{containers: [{{name: node, env: [{{name: MODE, value: patched}}]}}]}}
"""

PROBE = """
    import json, os
    with open(os.path.join(os.environ["TRAINJOB_JOB_DIR"], f"rank-{os.environ['RANK']}.json"), "w") as f:
        json.dump({k: os.environ.get(k) for k in ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "MODE")}, f)
"""


def test_both_generations_run_locally_with_the_same_result(backend, script, tmp_path):
    probe = script("probe_env.py", PROBE)
    files = tmp_path / "runtimes.yaml", tmp_path / "jobs.yaml"
    files[0].write_text(RUNTIMES)
    files[1].write_text(textwrap.dedent(JOBS.format(probe=probe)))
    runtimes = load_resources(files[0])

    for job in load_resources(files[1]):
        backend.apply(job, runtimes)

    for name in ("today", "seeds"):
        job = backend.wait_for_job_status(name, timeout=180)
        assert (job.status, job.num_nodes, job.num_proc_per_node) == ("Complete", 2, 2)
        seen = [json.loads((backend.store.job_dir(name) / f"rank-{r}.json").read_text()) for r in range(4)]
        assert seen == [{"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "MODE": "patched"}] * 4, name
    assert backend.get_job("today").resource["spec"]["activeDeadlineSeconds"] == 600
