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
from jobtest.local import delete_all_jobs, make_wheel, processes_under, wait_until

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


def test_the_seeds_sdk_example_runs_with_only_its_import_changed(subprocesses, client, offline_index, tmp_path,
                                                                 monkeypatch):
    example = tmp_path / "example.py"
    example.write_text(SEED_EXAMPLE, encoding="utf-8")
    # 4 nodes x 8 CPUs, 32Gi and 2 GPUs: more than this machine has, so it runs alone, scaled to it
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # and no GPU, whatever this machine has

    result = subprocess.run([sys.executable, str(example)], capture_output=True, text=True, timeout=240)

    assert result.returncode == 0, result.stderr[-2000:]
    # node-0's log, as the SDK prints it (with the prefix `trainjob logs` prints): pip's output, then the ranks
    lines = result.stdout.splitlines()
    assert "node-0 | Successfully installed transformers-4.53.0" in lines
    assert sorted(line for line in lines if "/rank-" in line) == ["node-0/rank-0 | Training on rank 0/8",
                                                                  "node-0/rank-1 | Training on rank 1/8"]
    (job,) = client.list_jobs()
    assert (job.status, job.num_nodes, job.num_proc_per_node) == ("Complete", 4, 2)
    every_rank = sorted(str(line) for line in client.backend.logs(job.name) if line.rank is not None)
    assert every_rank == [f"node-{r // 2}/rank-{r} | Training on rank {r}/8" for r in range(8)]
    reasons = {e.reason: e for e in client.get_job_events(job.name)}
    assert "transformers>=4.53.0" in reasons["PackagesInstalled"].message
    assert reasons["ScaledToMachine"].type == "Warning"
    assert "GPU: 4 node(s) x 2 = 8 asked, this machine has 0: the ranks see none" in reasons["ScaledToMachine"].message
    assert "scaled to this machine: 32 CPUs asked" in job.message


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
    ranks = [line for line in client.get_job_logs(name) if line.startswith("node-0/rank-")]  # after pip's output
    assert ranks == [f"node-0/rank-0 | {text!r}|42|4.53.0"]


def print_termcolor_version() -> None:
    from importlib.metadata import version

    import termcolor  # noqa: F401  (installed for the job, not in this environment)

    print("termcolor", version("termcolor"))


def test_packages_are_installed_once_per_set_and_the_next_job_reuses_them(local_jobs, client, trainjob_home):
    # a small real package from PyPI that this environment lacks, so pip really installs it
    assert importlib.util.find_spec("termcolor") is None, "pick a package this environment does not have"
    trainer = CustomTrainer(func=print_termcolor_version, packages_to_install=["termcolor==2.4.0"])

    first = client.train(trainer=trainer)
    assert client.wait_for_job_status(first, timeout=180).status == "Complete"
    second = client.train(trainer=trainer)
    assert client.wait_for_job_status(second, timeout=180).status == "Complete"

    first_log, second_log = list(client.get_job_logs(first)), list(client.get_job_logs(second))
    assert "node-0 | Successfully installed termcolor-2.4.0" in first_log
    assert not [line for line in second_log if "Collecting" in line or "Successfully installed" in line]
    assert "node-0 | [trainjob] already installed by an earlier job: reusing it" in second_log
    assert first_log[-1] == second_log[-1] == "node-0/rank-0 | termcolor 2.4.0"
    reasons = [[e.reason for e in client.get_job_events(name) if e.reason.startswith("Packages")]
               for name in (first, second)]
    assert reasons == [["PackagesInstalled"], ["PackagesReused"]]
    assert len(list((trainjob_home / "envs").glob("*/trainjob-env.json"))) == 1


@pytest.fixture
def slow_index(tmp_path: Path) -> Iterator[str]:
    """A package index on 127.0.0.1 holding ``slowpkg`` 1.0, whose wheel takes 3 s to arrive."""
    import http.server
    import threading

    wheel = make_wheel(tmp_path, "slowpkg", "1.0")

    class Index(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802  (http.server's name)
            if self.path.rstrip("/") == "/simple/slowpkg":
                body, kind = f'<a href="/files/{wheel.name}">{wheel.name}</a>'.encode(), "text/html"
            elif self.path == f"/files/{wheel.name}":
                time.sleep(3)
                body, kind = wheel.read_bytes(), "application/octet-stream"
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Index)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/simple"
    server.shutdown()
    server.server_close()


def import_slowpkg() -> None:
    import slowpkg

    print("slowpkg", slowpkg.__version__)


def test_jobs_asking_at_once_for_the_same_packages_install_them_once_and_show_pip_while_it_runs(
        local_jobs, client, slow_index):
    trainer = CustomTrainer(func=import_slowpkg, packages_to_install=["slowpkg==1.0"], pip_index_urls=[slow_index])
    names = [client.train(trainer=trainer) for _ in range(2)]

    def installing():
        jobs = [client.get_job(name) for name in names]
        return next((job for job in jobs if "Collecting slowpkg==1.0" in (job.message or "")), None)

    job = wait_until(installing, timeout=60, what="pip's progress in a job's message")
    assert (job.status, job.reason) == ("Created", "InstallingPackages")
    assert job.message.startswith("installing slowpkg==1.0: ")
    assert "node-0 | Collecting slowpkg==1.0" in list(client.get_job_logs(job.name))  # the wheel is on its way
    (other,) = [name for name in names if name != job.name]
    for name in names:
        assert client.wait_for_job_status(name, timeout=120).status == "Complete"
        assert list(client.get_job_logs(name))[-1] == "node-0/rank-0 | slowpkg 1.0"
    reasons = {name: [e.reason for e in client.get_job_events(name) if e.reason.startswith("Packages")]
               for name in names}
    assert (reasons[job.name], reasons[other]) == (["PackagesInstalled"], ["PackagesReused"])
    assert "node-0 | [trainjob] another job is installing the same packages; waiting for it" in \
        list(client.get_job_logs(other))


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
