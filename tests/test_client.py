"""The SDK: Kubeflow-style code runs with only its import changed; functions are shipped as source."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from jobtest.local import delete_all_jobs, make_wheel, processes_under

from trainjob.backends.base import Backend
from trainjob.backends.local.client.backend import LocalBackend, LocalProcessBackendConfig
from trainjob.errors import JobFailedError, NotFoundError, ValidationError
from trainjob.sdk.client import CustomTrainer, TrainerClient

# The seeds' SDK example, word for word except for its first import line.
SEED_EXAMPLE = '''
from trainjob.sdk.client import TrainerClient, CustomTrainer

# 定义训练函数
def train_pytorch():
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    # 初始化分布式环境（Kubeflow Trainer自动配置）
    device, backend = ("cuda", "nccl") if torch.cuda.is_available() else ("cpu", "gloo")
    dist.init_process_group(backend=backend)
    local_rank = int(os.environ.get("LOCAL_RANK", 0))

    # 创建模型
    model = torch.nn.Linear(10, 10).to(device)
    model = DDP(model)

    # 训练逻辑...
    print(f"Training on rank {dist.get_rank()}/{dist.get_world_size()}")
    dist.destroy_process_group()

# 创建训练任务
client = TrainerClient()
job_id = client.train(
    trainer=CustomTrainer(
        func=train_pytorch,
        num_nodes=4,  # 4个训练节点
        resources_per_node={
            "cpu": 8,
            "memory": "32Gi",
            "gpu": 2,  # 每节点2个GPU
        },
        packages_to_install=["transformers>=4.53.0"],  # 额外依赖
    )
)

# 等待任务完成
client.wait_for_job_status(job_id)

# 查看日志
for log in client.get_job_logs(job_id, follow=True):
    print(log)
'''


@pytest.fixture
def client(trainjob_home: Path) -> Iterator[TrainerClient]:
    yield TrainerClient(LocalProcessBackendConfig(home=trainjob_home))
    delete_all_jobs(LocalBackend(LocalProcessBackendConfig(home=trainjob_home)))
    assert processes_under(trainjob_home) == []


@pytest.fixture
def offline_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """pip finds packages only in a local folder (holding a small ``transformers`` 4.53.0 wheel)."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    make_wheel(wheels, "transformers", "4.53.0")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    return wheels


def test_the_seeds_sdk_example_runs_with_only_its_import_changed(subprocesses, client, offline_index, tmp_path, monkeypatch):
    example = tmp_path / "example.py"
    example.write_text(SEED_EXAMPLE, encoding="utf-8")
    # It asks for 4 nodes x 8 CPUs, 32Gi and 2 GPUs, more than this machine has: the local queue would refuse it.
    monkeypatch.setenv("TRAINJOB_OVERSUBSCRIBE", "1")

    result = subprocess.run([sys.executable, str(example)], capture_output=True, text=True, timeout=240)

    assert result.returncode == 0, result.stderr[-2000:]
    # the SDK's lines carry the prefix `trainjob logs` prints
    assert sorted(result.stdout.splitlines()) == ["node-0/rank-0 | Training on rank 0/8",
                                                  "node-0/rank-1 | Training on rank 1/8"]
    (job,) = client.list_jobs()
    assert (job.status, job.num_nodes, job.num_proc_per_node) == ("Complete", 4, 2)
    reasons = {e.reason: e.message for e in client.get_job_events(job.name)}
    assert "transformers>=4.53.0" in reasons["PackagesInstalled"]


def show_arguments(text: str, count: int) -> None:
    import torch  # noqa: F401  (the job's environment sees the installed torch)
    import transformers

    print(repr(text), count * 2, transformers.__version__, sep="|")


def test_function_arguments_reach_the_function_verbatim(local_jobs, client, offline_index):
    text = "$HOME `id`; rm -rf / && echo \"quoted\" 'single'"
    name = client.train(trainer=CustomTrainer(
        func=show_arguments, func_args={"text": text, "count": 21}, packages_to_install=["transformers"],
        resources_per_node={"cpu": 1},
    ))

    assert client.wait_for_job_status(name, timeout=120).status == "Complete"
    assert list(client.get_job_logs(name)) == [f"node-0/rank-0 | {text!r}|42|4.53.0"]


def test_a_failed_package_install_fails_the_job_with_pips_message(local_jobs, client, offline_index):
    name = client.train(trainer=CustomTrainer(func=show_arguments, func_args={"text": "", "count": 1},
                                              packages_to_install=["no-such-package-anywhere==1.0"]))
    started = time.monotonic()
    with pytest.raises(JobFailedError, match="PackageInstallFailed.*No matching distribution found for no-such-package-anywhere"):
        client.wait_for_job_status(name, timeout=120)
    # Real clock on purpose: guards that a failed install ends the wait at once, not at the 120 s timeout.
    assert time.monotonic() - started < 60
    assert client.get_job(name).steps == []


@pytest.mark.parametrize(
    ("trainer", "match"),
    [
        (CustomTrainer(func=lambda: None), "trainer.func: must be a function defined with def"),
        (CustomTrainer(func=show_arguments, func_args={"text": "x"}), "trainer.func_args: do not match show_arguments"),
        (CustomTrainer(func=show_arguments, func_args={"text": object(), "count": 1}), "JSON-serializable"),
        (CustomTrainer(func=show_arguments, func_args={"text": "", "count": 1}, num_nodes=0), "numNodes"),
    ],
)
def test_bad_trainers_are_refused_before_anything_starts(client, trainer, match):
    with pytest.raises(ValidationError, match=match):
        client.train(trainer=trainer)
    assert client.list_jobs() == []


def user_function(tmp_path: Path, source: str, name: str = "train"):
    """``name`` from a module written with ``source``, as a user's own file would define it."""
    path = tmp_path / f"user_code_{len(list(tmp_path.glob('user_code_*')))}.py"
    path.write_text(textwrap.dedent(source), encoding="utf-8")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


@pytest.mark.parametrize(
    ("source", "name", "match"),
    [
        ("def json():\n    print('hi')\n", "json", "trainer.func: is named 'json', which the job's script imports"),
        ("def outer():\n    n = 2\n    def train():\n        print(n)\n    return train\ntrain = outer()\n", "train",
         "trainer.func: uses n of the function that defines train"),
        ("SCALE = 2\ndef helper():\n    return 1\ndef train():\n    print(SCALE * helper())\n", "train",
         "trainer.func: uses SCALE, helper, which train neither imports nor defines"),
        ("LR = 0.1\ndef train(lr=LR):\n    pass\n", "train", "trainer.func: uses LR"),
        ("class Config:\n    pass\ndef train(config: Config = None):\n    pass\n", "train", "trainer.func: uses Config"),
        ("async def train():\n    pass\n", "train", "trainer.func: must be a plain function .def., got async function"),
    ],
)
def test_functions_that_would_fail_on_every_rank_are_refused_at_submit(client, tmp_path, source, name, match):
    with pytest.raises(ValidationError, match=match):
        client.train(trainer=CustomTrainer(func=user_function(tmp_path, source, name)))
    assert client.list_jobs() == []


def test_a_function_with_a_decorator_over_several_lines_runs_undecorated(local_jobs, client, tmp_path):
    train = user_function(tmp_path, """
        import functools

        def register(**options):
            return lambda f: functools.wraps(f)(lambda *a, **k: f(*a, **k))

        @register(
            name="several lines",
        )
        def train(greeting: str = "hi") -> None:
            x: Unused = 1  # a local variable's annotation is never evaluated
            print(greeting, os.environ["RANK"], x)
    """)

    name = client.train(trainer=CustomTrainer(func=train, func_args={"greeting": "hello"}))

    assert client.wait_for_job_status(name, timeout=120).status == "Complete"
    assert list(client.get_job_logs(name)) == ["node-0/rank-0 | hello 0 1"]


@pytest.mark.parametrize(
    "bad",
    ["--index-url=http://127.0.0.1:9/simple", "-r /etc/passwd", "--target", "/tmp/elsewhere", "tqdm --pre", "tqdm\n-e ."],
)
def test_packages_pip_would_read_as_options_are_refused(client, bad):
    with pytest.raises(ValidationError, match=r"trainer\.packages_to_install\[1\]: must be a PEP 508 requirement"):
        CustomTrainer(func=show_arguments, packages_to_install=["tqdm>=4", bad])

    trainer = CustomTrainer(func=show_arguments, func_args={"text": "", "count": 1}, packages_to_install=["tqdm"])
    trainer.packages_to_install.append(bad)  # changed after it was checked: checked again at submit
    with pytest.raises(ValidationError, match=r"packages_to_install\[1\]"):
        client.train(trainer=trainer)
    assert client.list_jobs() == []


@pytest.mark.parametrize(
    "requirement",
    ["transformers>=4.53.0", "accelerate[deepspeed] >= 0.30, < 2", "pkg @ https://host/pkg-1.0-py3-none-any.whl",
     "numpy; python_version >= '3.11' and sys_platform == 'linux'", "tqdm==4.*"],
)
def test_pep_508_requirements_are_accepted(requirement):
    assert CustomTrainer(func=show_arguments, packages_to_install=[requirement]).packages_to_install == [requirement]


def test_index_urls_must_be_urls():
    with pytest.raises(ValidationError, match=r"trainer\.pip_index_urls\[0\]: must be an http://, https:// or file:// URL"):
        CustomTrainer(func=show_arguments, pip_index_urls=["-r /etc/passwd"])


def test_the_backend_follows_the_config_type(trainjob_home):
    backend = TrainerClient().backend
    assert isinstance(backend, LocalBackend) and isinstance(backend, Backend)
    assert backend.store.home == trainjob_home
    with pytest.raises(ValidationError, match="backend_config: must be one of LocalProcessBackendConfig"):
        TrainerClient(backend_config={"namespace": "x"})


def test_runtimes_and_unknown_names(client):
    assert "torch-distributed" in [r.name for r in client.list_runtimes()]
    assert client.get_runtime("torch-distributed").trainer.framework == "torch"
    with pytest.raises(NotFoundError, match="known ClusterTrainingRuntimes: .*torch-distributed"):
        client.get_runtime("no-such-runtime")
    with pytest.raises(NotFoundError, match="'missing' not found"):
        client.get_job("missing")
