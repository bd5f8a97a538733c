"""What a local job's node process gets of the environment it is created from, and the Python settings every node
process has (see :mod:`~trainjob.backends.local.process_specs` for the whole environment of a node).

Imported by the warm processes, started before their job exists (a warm supervisor, its warm keepers), so it
imports only what they already have.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from trainjob.backends.local.worker_site import SITE_DIR
from trainjob.constants import JOB_DIR_ENV, PET_PREFIX

#: Inherited variables that would confuse the node processes (a job started from inside another job).
INHERITED_DROP_PREFIXES = (PET_PREFIX, "TORCHELASTIC_", "TRAINJOB_SITE_")
INHERITED_DROP = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT"}
#: What a node gets from the environment it is started from unless the job inherits all of it: what a pod's
#: container has anyway, what this Python environment needs, and trainjob's own settings.
PASSED_ENV = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR",
    "VIRTUAL_ENV", "CONDA_PREFIX", "CONDA_DEFAULT_ENV", "PYTHONPATH", "PYTHONHOME", "LD_LIBRARY_PATH",
    "CUDA_VISIBLE_DEVICES",
})
PASSED_ENV_PREFIXES = ("LC_", "TRAINJOB_")


def passed_env(environ: Mapping[str, str], inherit_env: bool = False) -> dict[str, str]:
    """What a node gets of ``environ``: :data:`PASSED_ENV` (everything with ``inherit_env``), never the variables
    of a launcher that started this process (``RANK``, ``PET_*`` ...: a job started from inside another job)."""
    return {
        key: value
        for key, value in environ.items()
        if key not in INHERITED_DROP
        and not key.startswith(INHERITED_DROP_PREFIXES)
        and (inherit_env or key in PASSED_ENV or key.startswith(PASSED_ENV_PREFIXES))
    }


def with_python(env: dict[str, str], python: str) -> dict[str, str]:
    """``env`` as a node process running ``python`` gets it: that Python first on ``PATH``, the node's
    ``sitecustomize`` first on ``PYTHONPATH``, output unbuffered unless the job says otherwise."""
    env["PATH"] = os.pathsep.join([os.path.dirname(python), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join([SITE_DIR, *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def warm_node_env(environ: Mapping[str, str], python: str) -> dict[str, str]:
    """The environment a node's warm torchrun, started before its job exists, starts with
    (:mod:`~trainjob.backends.local.node_keeper.warm_torchrun`): what a node of a job created now from ``environ`` would
    get, but for the job's own variables."""
    env = {key: value for key, value in passed_env(environ).items() if key != JOB_DIR_ENV}
    return with_python(env, python)

