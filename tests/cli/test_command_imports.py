"""What a command imports: ``trainjob list`` and the processes that run a job load only what they use.

Import time is most of what a short command costs (pydantic's models, the runtime framework, rich, torch), so
these tests pin down which modules stay unloaded; they check what is imported, never how long it takes.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from trainjob.backends.local.store import Store

#: Never needed to list jobs, or to supervise and keep a node: the API's models, the runtime framework, the
#: Kubernetes backend, the planner, the dashboard, rich and torch.
HEAVY = ("pydantic", "torch", "rich", "kubernetes", "trainjob.api", "trainjob.runtime.framework",
         "trainjob.runtime.catalog", "trainjob.backends.kubernetes", "trainjob.tools", "trainjob.ui",
         "trainjob.sdk.client", "trainjob.cli.tools", "trainjob.cli.top", "trainjob.cli.jobs_run")
REPORT = "import json, sys; print(json.dumps(sorted(sys.modules)), file=sys.stderr)"


def loaded(subprocesses, code: str, home: Path) -> set[str]:
    """The modules a fresh interpreter has loaded after running ``code`` (which prints them to stderr last)."""
    done = subprocesses.run([sys.executable, "-c", f"{code}\n{REPORT}"], capture_output=True, text=True,
                            env={"TRAINJOB_HOME": str(home), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stderr.splitlines()[-1]))


def heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY))


def add_job(home: Path) -> None:
    store = Store.open(home)
    store.insert_job({
        "name": "done", "namespace": "default", "uid": "u", "status": "Complete", "reason": "Completed",
        "message": None, "runtime": "torch-distributed", "num_nodes": 1, "num_proc_per_node": 1,
        "created": time.time(), "resource": {"kind": "TrainJob", "metadata": {"name": "done"}}, "launch": {},
    })
    store.close()


@pytest.mark.parametrize("argv", [["list"], ["list", "-o", "json"], ["list", "-o", "name"], ["--version"]])
def test_listing_imports_no_models_framework_or_other_commands(subprocesses, trainjob_home, argv):
    add_job(trainjob_home)
    code = f"from trainjob.cli.main import main\nassert main({argv!r}) == 0"

    assert heavy(loaded(subprocesses, code, trainjob_home)) == []


def test_supervisor_and_keeper_import_no_models_or_framework(subprocesses, trainjob_home):
    code = "import trainjob.backends.local.supervisor.supervisor, trainjob.backends.local.node_keeper.keeper"

    assert heavy(loaded(subprocesses, code, trainjob_home)) == []


def test_the_commands_listed_in_help_are_every_command(subprocesses):
    """Commands are imported when run; ``--help`` still lists each with its summary."""
    done = subprocesses.run([sys.executable, "-m", "trainjob.cli.main", "--help"], capture_output=True, text=True,
                            timeout=120)
    listed = [line.split()[0] for line in done.stdout.split("Commands:")[1].splitlines() if line.strip()]

    from trainjob.cli.main import COMMANDS

    assert done.returncode == 0
    assert listed == sorted(COMMANDS)
    assert "List jobs: name, status" in done.stdout
