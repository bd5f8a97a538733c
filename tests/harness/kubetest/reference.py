"""The reference schemas, taken from the upstream Go modules (``scripts/cluster/build.sh --manifests-only``).

JobSet's CRD (``sigs.k8s.io/jobset``), Kubeflow Trainer v2.1.0's CRDs and its ``torch_distributed`` runtime
(``github.com/kubeflow/trainer/v2``), and the PodGroup CRDs. Fetching them needs Go and the module proxy (seconds
once cached); tests that need them are skipped, with the reason, where Go is missing::

    crd = yaml.safe_load(reference_file("jobset", "jobset.x-k8s.io_jobsets.yaml").read_text())
"""

from __future__ import annotations

import functools
import shutil
import subprocess
from pathlib import Path

from kubetest.controlplane import BUILD_SCRIPT


@functools.cache
def reference_dir() -> Path:
    """The manifests directory; raises ``LookupError`` with the reason when it cannot be had."""
    if shutil.which("go") is None:
        raise LookupError("the reference schemas come from Go modules and need Go (https://go.dev/dl/)")
    done = subprocess.run(["bash", str(BUILD_SCRIPT), "--manifests-only"], capture_output=True, text=True)
    if done.returncode != 0:
        raise LookupError(f"scripts/cluster/build.sh --manifests-only failed: {done.stderr.strip()[-2000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


def reference_file(component: str, name: str) -> Path:
    """``reference_file("kubeflow", "trainer.kubeflow.org_trainjobs.yaml")``."""
    path = reference_dir() / component / name
    if not path.exists():
        raise LookupError(f"{path} is missing from the reference manifests")
    return path


@functools.cache
def kubeflow_source(current: bool = True) -> Path:
    """The source tree of the Kubeflow Trainer release ``scripts/cluster/kubeflow-current`` pins (v2.3.0; else
    ``kubeflow``'s, v2.1.0) from the Go module cache: its ``examples/``, manifests and initializers as released.
    ``LookupError`` with the reason when it cannot be had."""
    if shutil.which("go") is None:
        raise LookupError("Kubeflow Trainer's release comes from its Go module and needs Go (https://go.dev/dl/)")
    folder = BUILD_SCRIPT.parent / ("kubeflow-current" if current else "kubeflow")
    done = subprocess.run(["go", "mod", "download", "-json", "github.com/kubeflow/trainer/v2"], cwd=folder,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise LookupError(f"go mod download github.com/kubeflow/trainer/v2 failed: {done.stderr.strip()[-2000:]}")
    import json

    return Path(json.loads(done.stdout)["Dir"])
