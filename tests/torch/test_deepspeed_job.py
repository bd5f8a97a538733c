"""Real DeepSpeed on CPU: seed 003's script (examples/deepspeed/train.py) with its ds_configs as a 2 × 2 TrainJob.

DeepSpeed reads RANK, WORLD_SIZE and MASTER_ADDR from torchrun under the torch-distributed runtime. Every step uses
the same global batch whatever the layout (each rank takes its slice), so the 4-process job's losses must match one
process's: within 1e-5 relative in float32 (measured 1.4e-7: only the order of the gradient sums differs). The job must also learn (last loss under
90 % of the first), so two runs that did nothing cannot pass by agreeing. The same configs through
``deepspeed_initialize`` (trainjob's FSDP2/DDP, no DeepSpeed) must give DeepSpeed's losses too, so the mapping is
checked against the real thing: 1e-5 in float32 (measured 1.7e-6 for ZeRO-3 with offload and WarmupDecayLR, 5e-7 for
ZeRO-1), 2e-2 in bf16 (measured 2.7e-3; DeepSpeed and FSDP2 round bf16 at different places).

Skipped when DeepSpeed is not installed, unless TRAINJOB_REQUIRE_DEEPSPEED is set (then a missing DeepSpeed fails).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from jobtest import deepspeed_ops
from jobtest.local import delete_all_jobs, processes_under, trainjob_resource

from trainjob.backends.local.client.backend import LocalBackend, LocalProcessBackendConfig

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "deepspeed"
SCRIPT = EXAMPLES / "train.py"
STEPS = 12

if importlib.util.find_spec("deepspeed") is None and not os.environ.get("TRAINJOB_REQUIRE_DEEPSPEED"):
    pytest.skip("DeepSpeed is not installed (pip install 'trainjob[deepspeed]')", allow_module_level=True)

#: Without DeepSpeed's ops compiled in, the first job compiles them (CPU Adam, shared-memory comm): minutes on 2 busy
#: cores.
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def extensions(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Where DeepSpeed compiles the CPU ops it was not built with: a temp dir, once per module. ``bash
    scripts/test.sh`` installs DeepSpeed with them compiled in (:mod:`jobtest.deepspeed_ops`), and then nothing may
    be compiled there: a job that compiled one would say the wheel lacks it, and every run would pay the build.
    Once per module because the jobs and the reference runs find the same ninja (this environment's, first on both
    PATHs): two ninja versions record a build differently, and each would rebuild what the other built."""
    folder = tmp_path_factory.mktemp("torch_extensions")
    prebuilt = not deepspeed_ops.missing_ops()
    yield folder
    compiled = sorted(path.name for path in folder.glob("*/*.so"))
    if prebuilt and compiled:
        warnings.warn(f"DeepSpeed, installed with its CPU ops, compiled {', '.join(compiled)} again", stacklevel=1)


def _env(extensions: Path) -> dict[str, str]:
    return {"DS_ACCELERATOR": "cpu", "TORCH_EXTENSIONS_DIR": str(extensions)}


@pytest.fixture
def backend(trainjob_home: Path):
    backend = LocalBackend(LocalProcessBackendConfig(home=trainjob_home))
    yield backend
    delete_all_jobs(backend)
    assert processes_under(trainjob_home) == []


def _one_process(torchrun, tmp_path: Path, extensions: Path, config: str, *extra: str, nproc: int = 1) -> dict:
    result = tmp_path / f"{config}-{nproc}-{'-'.join(extra) or 'deepspeed'}.json"
    proc = torchrun(SCRIPT, "--deepspeed_config", str(EXAMPLES / f"{config}.json"), "--steps", str(STEPS),
                    "--result", str(result), *extra, nproc=nproc, env=_env(extensions), timeout=480)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(result.read_text())


# One config as a job: the job's launch does not depend on the config, and each config's DeepSpeed run is checked
# against trainjob's mapping below (bf16 included).
@pytest.mark.parametrize(("config", "tolerance"), [("ds_zero3_offload", 1e-5)])
def test_deepspeed_job_on_2_nodes_of_2_matches_one_process(backend, torchrun, tmp_path, extensions, config, tolerance):
    result = tmp_path / "job-result.json"
    env = [{"name": name, "value": value} for name, value in _env(extensions).items()]
    args = ["--deepspeed_config", str(EXAMPLES / f"{config}.json"), "--steps", str(STEPS), "--result", str(result)]
    backend.apply(trainjob_resource("deepspeed", ["torchrun", str(SCRIPT), *args], num_nodes=2, num_proc_per_node=2,
                                    env=env))  # fmt: skip
    job = backend.wait_for_job_status("deepspeed", {"Complete", "Failed"}, timeout=480)
    logs = "\n".join(line.text for line in backend.logs("deepspeed", rank=0))
    assert job.status == "Complete", logs[-4000:]
    four = json.loads(result.read_text())
    assert (four["world_size"], four["micro"], four["accumulation"]) == (4, 4, 2)  # train_batch_size 32 = 4 × 2 × 4
    assert f"step {STEPS}/{STEPS} loss=" in logs

    one = _one_process(torchrun, tmp_path, extensions, config)
    assert (one["world_size"], one["micro"]) == (1, 16)
    assert four["losses"][-1] < 0.9 * four["losses"][0], four["losses"]
    assert four["losses"] == pytest.approx(one["losses"], rel=tolerance)


@pytest.mark.parametrize(("config", "tolerance"), [("ds_zero1", 1e-5), ("ds_zero3_offload", 1e-5), ("ds_zero2_bf16", 2e-2)])
def test_trainjob_mapping_of_a_ds_config_trains_like_deepspeed(torchrun, tmp_path, extensions, config, tolerance):
    deepspeed = _one_process(torchrun, tmp_path, extensions, config, nproc=2)
    ours = _one_process(torchrun, tmp_path, extensions, config, "--trainjob", nproc=2)
    assert ours["losses"][-1] < 0.9 * ours["losses"][0]
    assert ours["losses"] == pytest.approx(deepspeed["losses"], rel=tolerance)


def test_deepspeed_imports_in_the_interpreter_the_jobs_use():
    """With TRAINJOB_REQUIRE_DEEPSPEED set and DeepSpeed missing, this is the test that says so."""
    assert importlib.util.find_spec("deepspeed") is not None, f"DeepSpeed is not importable by {sys.executable}"
