"""kubectl habits: list -o/-l/-w, describe, delete A B / --all, apply --dry-run, backend selection and config."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import yaml
from jobtest.local import processes_under

from trainjob.backends.local.client.backend import LocalBackend, LocalProcessBackendConfig
from trainjob.cli.plumbing import Target, resolve_target
from trainjob.cli.selectors import parse_selector
from trainjob.errors import ValidationError

JOB = """
apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainJob
metadata:
  name: {name}
  labels: {labels}
spec:
  runtimeRef: {{name: torch-distributed}}
  suspend: true
  trainer:
    numNodes: 2
    command: [python, -c, "print('hi')"]
"""


@pytest.fixture(autouse=True)
def no_kubernetes_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for var in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "user"))  # no ~/.kube/config, no ~/.config/trainjob
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "user" / ".config"))


def apply(cli, tmp_path: Path, name: str, **labels: str) -> None:
    path = tmp_path / f"{name}.yaml"
    path.write_text(JOB.format(name=name, labels=json.dumps(labels)))
    assert cli("apply", "-f", str(path))[0] == 0


@pytest.fixture
def three(cli, tmp_path: Path) -> None:
    apply(cli, tmp_path, "vision-a", team="vision", tier="prod")
    apply(cli, tmp_path, "vision-b", team="vision", tier="dev")
    apply(cli, tmp_path, "speech", team="speech")


def names_in(table: str) -> list[str]:
    return [line.split()[0] for line in table.strip().splitlines()[1:]]


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("team=vision", ["vision-a", "vision-b"]),
        ("team==vision,tier!=dev", ["vision-a"]),
        ("tier", ["vision-a", "vision-b"]),
        ("!tier", ["speech"]),
        ("team in (speech, nlp)", ["speech"]),
        ("team notin (speech)", ["vision-a", "vision-b"]),
        ("team=nobody", []),
    ],
)
def test_list_filters_by_label_selector(cli, three, selector, expected):
    code, out, _ = cli("list", "-l", selector)
    assert code == 0 and names_in(out) == expected


def test_a_selector_it_cannot_read_is_bad_input(cli, three):
    code, _, err = cli("list", "-l", "team=(vision")
    assert code == 2 and "-l: cannot read" in err
    with pytest.raises(ValidationError):
        parse_selector("a b c")


def test_list_outputs_wide_json_yaml_and_name(cli, three):
    wide = cli("list", "-o", "wide")[1].splitlines()
    assert wide[0].split()[-3:] == ["RESTARTS", "REASON", "LABELS"]
    assert "team=vision,tier=prod" in wide[1]
    listed = json.loads(cli("list", "-o", "json", "-l", "team=vision")[1])
    assert listed["kind"] == "List" and [i["metadata"]["name"] for i in listed["items"]] == ["vision-a", "vision-b"]
    assert listed["items"][0]["status"]["conditions"][0]["type"] == "Suspended"
    as_yaml = yaml.safe_load(cli("list", "-o", "yaml")[1])
    assert [i["metadata"]["labels"]["team"] for i in as_yaml["items"]] == ["vision", "vision", "speech"]
    assert cli("list", "-o", "name")[1].split() == ["trainjob/vision-a", "trainjob/vision-b", "trainjob/speech"]


def test_watch_prints_the_list_then_the_changes(cli, three, trainjob_home):
    def delete_later() -> None:
        time.sleep(1.0)
        LocalBackend(LocalProcessBackendConfig(home=trainjob_home)).delete_job("speech")

    thread = threading.Thread(target=delete_later)
    thread.start()
    code, out, _ = cli("list", "-w", "--timeout", "3")
    thread.join()
    lines = out.strip().splitlines()
    assert code == 0 and lines[0].split()[:2] == ["NAME", "STATUS"]
    assert [line.split()[:2] for line in lines[1:]] == [
        ["vision-a", "Suspended"], ["vision-b", "Suspended"], ["speech", "Suspended"], ["speech", "Deleted"]]


def test_describe_shows_spec_status_conditions_nodes_and_events(cli, three):
    code, out, _ = cli("describe", "trainjob", "vision-a")
    assert code == 0
    for expected in ("Name:         vision-a", "Labels:       team=vision, tier=prod", "Status:       Suspended",
                     "Spec:", "  Nodes:      2 x 1 process(es)", "  Command:    python -c ",
                     "Conditions:", "Nodes:", "  node-0   0       ", "  node-1   1       ", "Events:", "Created"):
        assert expected in out, (expected, out)
    assert cli("describe", "nobody")[0] == 2


def test_delete_deletes_what_exists_and_reports_what_does_not(cli, three, trainjob_home):
    code, out, err = cli("delete", "vision-a", "ghost", "speech")
    assert code == 2
    assert out.splitlines() == ["trainjob/vision-a deleted", "trainjob/speech deleted"]
    assert err.strip() == "error: trainjob/ghost not found"
    assert names_in(cli("list")[1]) == ["vision-b"]


def test_delete_all_and_by_selector(cli, three):
    assert cli("delete", "-l", "team=vision")[1].split() == [
        "trainjob/vision-a", "deleted", "trainjob/vision-b", "deleted"]
    assert cli("delete", "--all")[:2] == (0, "trainjob/speech deleted\n")
    assert cli("delete", "--all")[0] == 0
    assert cli("delete")[0] == 2  # nothing said: names, --all or -l
    assert cli("delete", "x", "--all")[0] == 2


def test_apply_dry_run_resolves_and_creates_nothing(cli, tmp_path, trainjob_home):
    path = tmp_path / "job.yaml"
    path.write_text(JOB.format(name="dry", labels="{}").replace("suspend: true", "suspend: false"))
    code, out, _ = cli("apply", "-f", str(path), "--dry-run")
    assert code == 0
    assert out.startswith("trainjob/dry created (dry run): 2 node(s) x 1 process(es) on runtime torch-distributed")
    shown = yaml.safe_load(cli("apply", "-f", str(path), "--dry-run", "-o", "yaml")[1])
    assert shown["metadata"]["name"] == "dry" and shown["spec"]["trainer"]["numNodes"] == 2
    assert cli("list", "-o", "name")[1] == ""
    assert processes_under(trainjob_home) == []
    bad = tmp_path / "bad.yaml"
    bad.write_text(path.read_text().replace("numNodes: 2", "numNodes: 0"))
    code, _, err = cli("apply", "-f", str(bad), "--dry-run")
    assert code == 2 and "numNodes" in err


def test_apply_resolves_each_job_once_and_the_store_keeps_what_it_resolved_to(cli, tmp_path, monkeypatch):
    """``apply`` checks every job with the backend (one resolve each) and creates them from that check; the job
    then shows the resolved numbers (``numProcPerNode: auto`` on 3 CPUs: 3 processes per node)."""
    import trainjob.runtime

    monkeypatch.setenv("TRAINJOB_OVERSUBSCRIBE", "1")  # 6 CPUs asked for, whatever this machine has
    resolved: list[str] = []
    real = trainjob.runtime.resolve
    monkeypatch.setattr(trainjob.runtime, "resolve", lambda job, *a, **k: resolved.append(job.name) or real(job, *a, **k))
    path = tmp_path / "job.yaml"
    path.write_text(JOB.format(name="once", labels="{}").replace(
        "numNodes: 2", "numNodes: 2\n    numProcPerNode: auto\n    resourcesPerNode: {requests: {cpu: '3'}}"))
    assert cli("apply", "-f", str(path))[0] == 0
    assert resolved == ["once"]
    job = LocalBackend(LocalProcessBackendConfig()).get_job("once")
    assert (job.num_nodes, job.num_proc_per_node) == (2, 3)


def test_backend_from_env_and_config_file(monkeypatch, tmp_path, trainjob_home):
    assert resolve_target(None, None, None, None) == Target("local")
    config = trainjob_home / "config.yaml"
    trainjob_home.mkdir(parents=True, exist_ok=True)
    config.write_text("backend: kubernetes\nnamespace: ml-team\ncontext: prod\nkubeconfig: /etc/kube.yaml\n")
    assert resolve_target(None, None, None, None) == Target("kubernetes", "ml-team", "/etc/kube.yaml", "prod")
    assert resolve_target(None, "other", None, None).namespace == "other"  # flags win
    monkeypatch.setenv("KUBECONFIG", "/from/env")
    assert resolve_target(None, None, None, None).kubeconfig is None  # $KUBECONFIG beats the file
    monkeypatch.setenv("TRAINJOB_BACKEND", "local")
    assert resolve_target(None, None, None, None) == Target("local")  # the variable beats the file
    assert resolve_target("kubernetes", None, None, None).backend == "kubernetes"  # the flag beats both


@pytest.mark.parametrize(
    ("setup", "argv", "message"),
    [
        ({"TRAINJOB_BACKEND": "cloud"}, ["list"], "TRAINJOB_BACKEND: must be one of local, kubernetes"),
        ({}, ["list", "-n", "ml-team"], "--namespace: applies to the kubernetes backend only"),
        ({}, ["list", "--backend", "kubernetes"], "--kubeconfig: no kubeconfig found"),
        ({}, ["list", "--backend", "kubernetes", "--kubeconfig", "/no/such/file"], "--kubeconfig: no such file"),
        ({"KUBECONFIG": "/no/such/file"}, ["logs", "x", "--backend", "kubernetes"], "--kubeconfig: KUBECONFIG names no file"),
        ({"config": "backend: kubernetes\n"}, ["get", "x"], "--kubeconfig: no kubeconfig found"),
        ({"config": "backnd: kubernetes\n"}, ["list"], "backnd: unknown setting"),
    ],
)
def test_backend_mistakes_are_usage_errors_naming_the_fix(cli, monkeypatch, trainjob_home, setup, argv, message):
    for key, value in setup.items():
        if key == "config":
            trainjob_home.mkdir(parents=True, exist_ok=True)
            (trainjob_home / "config.yaml").write_text(value)
        else:
            monkeypatch.setenv(key, value)
    code, _, err = cli(*argv)
    assert code == 2 and message in err, err
