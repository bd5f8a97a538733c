"""An SDK ``CustomTrainer`` as a TrainJob: the function's source in a generated script, run by torchrun.

The script holds the function's source (checked and stripped of decorators by
:func:`trainjob.trainer_checks.function_source`) and calls it with ``**func_args`` decoded from a JSON literal;
nothing passes through a shell. It imports :data:`~trainjob.trainer_checks.SCRIPT_IMPORTS` first (training
functions often use ``os`` and ``sys`` unimported), and ends the process without interpreter teardown once the
function returned. The generated script is compiled before the job is created::

    script = function_script(train, {"epochs": 2})
    job = function_trainjob("a1b2c3d4e5f6", trainer, "torch-distributed", "/path/to/train_function.py")
"""

from __future__ import annotations

import inspect
import json
from typing import Any

from trainjob.errors import ValidationError
from trainjob.trainer_checks import SCRIPT_IMPORTS, function_source
from trainjob.types import CustomTrainer

SCRIPT_NAME = "train_function.py"
#: SDK resource names and the Kubernetes resource they mean.
RESOURCE_ALIASES = {"gpu": "nvidia.com/gpu"}


def function_script(func: Any, func_args: dict[str, Any] | None) -> str:
    """Python source that defines ``func`` and calls it with ``func_args``."""
    source = function_source(func)
    name = source.name
    args = dict(func_args or {})
    try:
        inspect.signature(func).bind(**args)
    except TypeError as exc:
        raise ValidationError("trainer.func_args", f"do not match {name}{inspect.signature(func)}: {exc}") from None
    try:
        encoded = json.dumps(args)
    except (TypeError, ValueError) as exc:
        raise ValidationError("trainer.func_args", f"must be JSON-serializable: {exc}") from None
    imports = "".join(f"import {module}\n" for module in SCRIPT_IMPORTS)
    script = (
        f'"""Runs {name}(**func_args) in every training process of the job."""\n\n'
        f"{imports}\n"
        f"{source.text}\n\n\n"
        'if __name__ == "__main__":\n'
        f"    {name}(**json.loads({encoded!r}))\n"
        "    # Exit handlers run, interpreter teardown does not: on CPU, gloo's background threads can abort a\n"
        "    # process (SIGABRT) while Python finalizes after the work is done, failing a finished job.\n"
        "    atexit._run_exitfuncs()\n"
        "    sys.stdout.flush()\n"
        "    sys.stderr.flush()\n"
        "    os._exit(0)\n"
    )
    try:
        compile(script, SCRIPT_NAME, "exec")
    except SyntaxError as exc:
        raise ValidationError("trainer.func", f"the script made from its source does not compile: {exc}") from None
    return script


def resources_per_node(resources: dict[str, Any] | None) -> dict[str, str]:
    """SDK resources (``{"cpu": 2, "gpu": 1, "memory": "8Gi"}``) as Kubernetes requests."""
    return {RESOURCE_ALIASES.get(key, key): str(value) for key, value in (resources or {}).items()}


def function_trainjob(name: str, trainer: CustomTrainer, runtime: str, script_path: str) -> dict[str, Any]:
    """The TrainJob (Kubernetes shape) that runs ``script_path`` with torchrun on ``runtime``."""
    spec_trainer: dict[str, Any] = {"command": ["torchrun", script_path]}
    if trainer.num_nodes is not None:
        spec_trainer["numNodes"] = trainer.num_nodes
    resources = resources_per_node(trainer.resources_per_node)
    if resources:
        spec_trainer["resourcesPerNode"] = {"requests": resources, "limits": resources}
    if trainer.env:
        spec_trainer["env"] = [{"name": key, "value": str(value)} for key, value in trainer.env.items()]
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name},
        "spec": {"runtimeRef": {"name": runtime}, "trainer": spec_trainer},
    }
