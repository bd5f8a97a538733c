"""The framework: phase order, plugin registry (entry points included), and what it checks before plugins run."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainjob.api import TrainingRuntime
from trainjob.api.runtime import PodGroupPolicy
from trainjob.errors import ValidationError
from trainjob.runtime import PHASES, Framework, Plugin, builtin_runtimes, resolve
from trainjob.runtime.framework import builtin_plugins, registered_plugins


class Recorder(Plugin):
    def __init__(self, name: str, calls: list[str]) -> None:
        self.name = name  # type: ignore[misc]
        self.calls = calls

    def validate(self, ctx):
        self.calls.append(f"{self.name}.validate")
        return []

    def enforce_ml_policy(self, ctx):
        self.calls.append(f"{self.name}.enforce_ml_policy")

    def enforce_pod_group_policy(self, ctx):
        self.calls.append(f"{self.name}.enforce_pod_group_policy")

    def build(self, ctx):
        self.calls.append(f"{self.name}.build")


def test_phases_are_validate_ml_policy_pod_group_policy_build():
    assert PHASES == ("validate", "enforce_ml_policy", "enforce_pod_group_policy", "build")


def test_every_plugin_finishes_a_phase_before_the_next_phase_starts(make_job):
    calls: list[str] = []
    framework = Framework([*builtin_plugins(), Recorder("a", calls), Recorder("b", calls)])
    plan = framework.resolve(make_job(), builtin_runtimes()["torch-distributed"])
    assert calls == [f"{name}.{phase}" for phase in PHASES for name in ("a", "b")]
    assert plan.plugins == ["torch", "jobset", "a", "b"]


def test_builtin_plugins_have_a_fixed_order():
    assert [p.name for p in builtin_plugins()] == ["torch", "mpi", "ray", "plainml", "coscheduling", "volcano", "jobset"]


@pytest.fixture
def plugin_site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An installed distribution ``extra-plugins`` that publishes a plugin in the ``trainjob.plugins`` group."""
    site = tmp_path
    (site / "extra_plugins.py").write_text(
        textwrap.dedent(
            """
            from trainjob.runtime import Plugin

            class PriorityClass(Plugin):
                name = "priority-class"

                def build(self, ctx):
                    for pod_set in ctx.plan.pod_sets:
                        pod_spec = pod_set.template.setdefault("spec", {}).setdefault("template", {})
                        pod_spec.setdefault("spec", {})["priorityClassName"] = "high"

            class Torch(Plugin):
                name = "torch"
            """
        )
    )
    dist_info = site / "extra_plugins-1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: extra-plugins\nVersion: 1.0\n")
    (dist_info / "entry_points.txt").write_text(
        "[trainjob.plugins]\npriority-class = extra_plugins:PriorityClass\n"
    )
    monkeypatch.syspath_prepend(str(site))
    yield site
    sys.modules.pop("extra_plugins", None)


@pytest.mark.usefixtures("plugin_site")
def test_a_third_party_plugin_registers_through_the_entry_point_group(make_job):
    framework = Framework()
    assert [p.name for p in framework.plugins] == [
        "torch",
        "mpi",
        "ray",
        "plainml",
        "coscheduling",
        "volcano",
        "jobset",
        "priority-class",
    ]
    plan = framework.resolve(make_job(), builtin_runtimes()["torch-distributed"])
    assert plan.plugins[-1] == "priority-class"
    assert plan.trainer().template["spec"]["template"]["spec"]["priorityClassName"] == "high"


@pytest.mark.usefixtures("plugin_site")
def test_a_plugin_with_a_builtin_name_replaces_the_builtin_in_place():
    import extra_plugins

    plugins = registered_plugins(extra=[extra_plugins.Torch()])
    assert [p.name for p in plugins][0] == "torch" and isinstance(plugins[0], extra_plugins.Torch)


def test_runtimes_without_ml_policy_run_with_plainml(make_job, make_runtime):
    plan = resolve(make_job(runtime="rt", numNodes=3), make_runtime())
    assert (plan.ml_policy, plan.num_nodes, plan.num_proc_per_node, plan.trainer().count) == (
        "plainml",
        3,
        1,
        3,
    )
    assert not any(var.name.startswith("PET_") for var in plan.trainer().container().env)
    assert plan.plugins == ["plainml", "jobset"]


def test_plainml_rejects_num_proc_per_node(make_job, make_runtime):
    with pytest.raises(
        ValidationError,
        match=r"^spec\.trainer\.numProcPerNode: only applies to runtimes with mlPolicy\.torch",
    ):
        resolve(make_job(runtime="rt", numProcPerNode=2), make_runtime(mlPolicy={"numNodes": 2}))


def test_a_policy_no_plugin_runs_is_refused_naming_what_runs(make_job, make_runtime):
    with pytest.raises(ValidationError) as err:
        resolve(make_job(runtime="rt"), make_runtime(mlPolicy={"jax": {}}))
    assert str(err.value) == (
        "spec.mlPolicy: no installed plugin runs jax ML policy (plugins: jobset); "
        "use mlPolicy.torch, mlPolicy.mpi or no mlPolicy"
    )


def test_the_runtime_must_be_the_one_the_job_refers_to(make_job):
    with pytest.raises(ValidationError) as err:
        resolve(make_job(runtime="other"), builtin_runtimes()["torch-distributed"])
    assert str(err.value) == (
        "spec.runtimeRef: refers to ClusterTrainingRuntime 'other', but ClusterTrainingRuntime 'torch-distributed' "
        "was given to resolve it"
    )


def test_a_training_runtime_must_live_in_the_jobs_namespace(make_job):
    runtime = TrainingRuntime.from_dict(
        {
            "metadata": {"name": "rt", "namespace": "team-b"},
            "spec": {"template": {"spec": {"replicatedJobs": [{"name": "node", "template": {}}]}}},
        }
    )
    job = make_job(spec={"runtimeRef": {"name": "rt", "kind": "TrainingRuntime"}})
    with pytest.raises(
        ValidationError, match="TrainingRuntime 'rt' is in namespace 'team-b', the TrainJob in 'default'"
    ):
        resolve(job, runtime)


def test_a_runtime_without_a_trainer_job_is_refused(make_job, make_runtime):
    runtime = make_runtime()
    runtime.spec.template.spec.replicated_jobs[0].name = "worker"
    runtime.spec.template.spec.replicated_jobs[0].template["metadata"] = {}
    with pytest.raises(
        ValidationError, match=r"^spec\.template\.spec\.replicatedJobs: runtime 'rt' has no trainer job"
    ):
        resolve(make_job(runtime="rt"), runtime)


def test_trainer_fields_replace_the_runtime_container_fields(make_job, make_runtime):
    runtime = make_runtime(mlPolicy={"torch": {}}, container={"command": ["python"], "args": ["a.py"]})
    container = (
        resolve(make_job(runtime="rt", image="mine:2", command=["torchrun"], args=["b.py"]), runtime)
        .trainer()
        .container()
    )
    assert (container.image, container.command, container.args) == ("mine:2", ["torchrun"], ["b.py"])
    untouched = resolve(make_job(runtime="rt"), runtime).trainer().container()
    assert (untouched.image, untouched.command, untouched.args) == ("torch:1", ["python"], ["a.py"])


def test_resolving_does_not_change_the_runtime(make_job):
    runtime = builtin_runtimes()["torch-distributed"]
    before = runtime.to_dict()
    resolve(make_job(numNodes=2, spec={"labels": {"a": "b"}}), runtime)
    assert runtime.to_dict() == before


@pytest.fixture
def legacy_plugin_site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A distribution whose plugin is written against the earlier base class: it overrides ``validate`` and
    ``build`` only, and ``build`` calls a helper of its own."""
    (tmp_path / "legacy_plugins.py").write_text(
        textwrap.dedent(
            """
            from trainjob.errors import ValidationError
            from trainjob.runtime.framework import Context, Plugin

            class Owner(Plugin):
                name = "owner"

                def validate(self, ctx: Context):
                    if "owner" not in (ctx.trainjob.spec.labels or {}):
                        return [ValidationError("spec.labels", "needs an owner label")]
                    return []

                def build(self, ctx: Context):
                    ctx.plan.labels["owned-by"] = self._owner(ctx)

                def _owner(self, ctx):
                    return ctx.trainjob.spec.labels["owner"]
            """
        )
    )
    dist_info = tmp_path / "legacy_plugins-1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: legacy-plugins\nVersion: 1.0\n")
    (dist_info / "entry_points.txt").write_text("[trainjob.plugins]\nowner = legacy_plugins:Owner\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("legacy_plugins", None)


@pytest.mark.usefixtures("legacy_plugin_site")
def test_an_entry_point_plugin_of_the_single_base_class_runs_the_phases_it_defines(make_job):
    framework = Framework()
    (owner,) = [p for p in framework.plugins if p.name == "owner"]
    assert owner in framework.validators and owner in framework.builders
    assert owner not in framework.ml_policy_enforcers and owner not in framework.pod_group_enforcers
    runtime = builtin_runtimes()["torch-distributed"]
    plan = framework.resolve(make_job(spec={"labels": {"owner": "ana"}}), runtime)
    assert plan.labels["owned-by"] == "ana" and plan.plugins[-1] == "owner"
    with pytest.raises(ValidationError, match="spec.labels: needs an owner label"):
        framework.resolve(make_job(), runtime)


def test_the_framework_sorts_plugins_into_phases_once_and_calls_only_the_phases_they_have(make_job):
    calls: list[str] = []

    class GangOnly(Plugin):
        name = "gang-only"

        def enforce_pod_group_policy(self, ctx):
            calls.append("pod-group")

    class Quiet(Plugin):
        name = "quiet"

    framework = Framework([*builtin_plugins(), GangOnly(), Quiet()])
    assert [p.name for p in framework.pod_group_enforcers] == ["coscheduling", "volcano", "gang-only"]
    assert [p.name for p in framework.validators] == ["torch", "mpi", "ray", "plainml", "jobset"]
    assert [p.name for p in framework.builders] == ["jobset"]
    plan = framework.resolve(make_job(), builtin_runtimes()["torch-distributed"])
    assert calls == ["pod-group"] and plan.plugins == ["torch", "jobset", "gang-only", "quiet"]


def test_a_disabled_plugin_runs_no_phase(make_job):
    calls: list[str] = []

    class Off(Recorder):
        def enabled(self, ctx):
            return False

    Framework([*builtin_plugins(), Off("off", calls)]).resolve(make_job(), builtin_runtimes()["torch-distributed"])
    assert calls == []


def test_the_ml_policy_check_runs_after_every_ml_plugin_and_before_gang_scheduling(make_job, make_runtime):
    calls: list[str] = []

    class JaxPlugin(Plugin):
        name = "jax"

        def enforce_ml_policy(self, ctx):
            calls.append("jax")
            ctx.plan.ml_policy = "jax"

    runtime = make_runtime(mlPolicy={"jax": {}})
    plan = Framework([JaxPlugin(), *builtin_plugins()]).resolve(make_job(runtime="rt"), runtime)
    assert calls == ["jax"] and plan.ml_policy == "jax" and plan.plugins == ["jax", "jobset"]


def test_render_phase_runs_the_renderers_of_the_plugins_that_took_part(make_job):
    class Extra(Plugin):
        name = "extra"

        def render(self, plan):
            return [{"kind": "ConfigMap", "metadata": {"name": plan.job_name + "-extra"}}]

    class Elsewhere(Extra):
        name = "elsewhere"

        def enabled(self, ctx):
            return False

    framework = Framework([*builtin_plugins(), Extra(), Elsewhere()])
    plan = framework.resolve(make_job(), builtin_runtimes()["torch-distributed"])
    assert [o["kind"] for o in framework.render(plan)] == ["JobSet", "ConfigMap"]
    assert framework.render(plan)[1]["metadata"]["name"] == "mnist-extra"


def test_objects_come_jobset_then_pod_group_then_what_the_ml_plugin_adds(make_job):
    runtime = builtin_runtimes()["mpi-distributed"]
    runtime.spec.pod_group_policy = PodGroupPolicy.from_dict({"coscheduling": {}})
    plan = resolve(make_job(runtime="mpi-distributed", numNodes=2), runtime)
    assert [o["kind"] for o in Framework().render(plan)] == ["JobSet", "PodGroup", "Secret", "ConfigMap"]
