"""``trainjob run --data CLAIM:/PATH[:ro]`` mounts claims as arena's ``--data`` does, and ``--config-map NAME=PATH``
gives ``run`` and ``apply`` the configMaps a pod template mounts."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from trainjob.backends.local.volumes import VOLUMES_ROOT_ENV
from trainjob.cli.arena import data_overrides as arena_data_overrides
from trainjob.cli.volume_flags import data_overrides
from trainjob.errors import ValidationError

WRITER = """
    import os, sys
    out, ro = sys.argv[1], sys.argv[2]
    with open(os.path.join(out, f"node-{os.environ['GROUP_RANK']}.txt"), "w") as f:
        f.write("hello")
    try:
        open(os.path.join(ro, "x"), "w").close()
        print("read-only mount was writable", flush=True)
    except OSError as exc:
        print("ro:", exc.strerror, flush=True)
"""


@pytest.fixture
def claims(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "claims"
    monkeypatch.setenv(VOLUMES_ROOT_ENV, str(root))
    return root / "default"


def test_run_data_mounts_the_claims_on_every_node(local_jobs, cli, tmp_path, claims, monkeypatch):
    monkeypatch.setenv("TRAINJOB_MOUNT_MECHANISM", "namespace")
    script = tmp_path / "writer.py"
    script.write_text(textwrap.dedent(WRITER))

    code, _, err = cli("run", str(script), "--name", "withdata", "--nodes", "2", "--data", "results:/output",
                       "--data", "datasets:/datasets:ro", "--", "/output", "/datasets")

    assert code == 0, err
    assert sorted(p.name for p in (claims / "results").iterdir()) == ["node-0.txt", "node-1.txt"]
    assert list((claims / "datasets").iterdir()) == [], "the read-only claim was created empty and stayed so"
    logs = cli("logs", "withdata")[1]
    assert logs.count("ro: Read-only file system") == 2 and "writable" not in logs
    resource = json.loads(cli("get", "withdata", "-o", "json")[1])
    mounts = resource["spec"]["podTemplateOverrides"][0]["spec"]["containers"][0]["volumeMounts"]
    assert mounts == [{"name": "data-0", "mountPath": "/output"},
                      {"name": "data-1", "mountPath": "/datasets", "readOnly": True}]


def test_run_data_that_is_not_claim_and_path_is_refused(cli, tmp_path, claims):
    script = tmp_path / "hello.py"
    script.write_text("print('hello')\n")
    code, _, err = cli("run", str(script), "--data", "results", "-d")
    assert code == 2 and "--data: must be PVC_NAME:/mount/path (or PVC_NAME:/mount/path:ro), got 'results'" in err
    assert cli("list", "-o", "name")[1].strip() == ""


def test_arena_data_is_the_same_as_run_data():
    assert arena_data_overrides is data_overrides
    with pytest.raises(ValidationError, match="got 'c:data'"):
        data_overrides(("c:data",))


CONFIG_JOB = """
apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainJob
metadata: {name: configured}
spec:
  runtimeRef: {name: torch-distributed}
  trainer: {command: [python, SCRIPT]}
  podTemplateOverrides:
    - targetJobs: [{name: node}]
      spec:
        volumes: [{name: settings, configMap: {name: train-settings}}]
        containers: [{name: node, volumeMounts: [{name: settings, mountPath: /etc/settings}]}]
"""


def test_apply_needs_the_config_maps_the_job_mounts(local_jobs, cli, tmp_path, claims, monkeypatch):
    monkeypatch.setenv("TRAINJOB_MOUNT_MECHANISM", "env")
    script = tmp_path / "show.py"
    script.write_text("import sys\nprint('setting', open('/etc/settings/lr.txt').read(), flush=True)\n")
    job = tmp_path / "job.yaml"
    job.write_text(CONFIG_JOB.replace("SCRIPT", str(script)))
    (tmp_path / "lr.txt").write_text("0.25")

    code, _, err = cli("apply", "-f", str(job))
    assert code == 2 and "configMap 'train-settings' was not given" in err and "--config-map NAME=PATH" in err
    code, _, err = cli("apply", "-f", str(job), "--config-map", f"train-settings={tmp_path / 'missing.txt'}")
    assert code == 2 and "missing.txt (configMap train-settings) does not exist" in err
    assert cli("list", "-o", "name")[1].strip() == ""

    code, out, err = cli("apply", "-f", str(job), "--config-map", f"train-settings={tmp_path / 'lr.txt'}")

    assert code == 0, err
    assert cli("wait", "configured", "--timeout", "60")[0] == 1, "env: a path inside the script is not rewritten"
    script.write_text("import os, sys\nprint('setting', open(os.environ['TRAINJOB_MOUNT_SETTINGS'] + '/lr.txt').read(),"
                      " flush=True)\n")
    assert cli("delete", "configured")[0] == 0
    code, _, err = cli("apply", "-f", str(job), "--config-map", f"train-settings={tmp_path / 'lr.txt'}")
    assert code == 0, err
    assert cli("wait", "configured", "--timeout", "60")[0] == 0
    assert "setting 0.25" in cli("logs", "configured")[1]


def test_run_config_map_is_for_local_jobs_only(cli, tmp_path):
    script = tmp_path / "hello.py"
    script.write_text("print('hello')\n")
    code, _, err = cli("run", str(script), "--config-map", f"x={script}", "--backend", "kubernetes", "-d")
    assert code == 2 and "--config-map: applies to local jobs only" in err
