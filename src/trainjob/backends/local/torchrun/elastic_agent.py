"""``torchrun`` for the nodes of a shrinkable local job: ``python -m trainjob.backends.local.torchrun.elastic_agent ARGS``.

The same as ``torchrun ARGS`` but for one decision: when this node's ranks fail, the agent restarts them in
place (a new rendezvous, at the size of the nodes still there) only if the supervisor recorded a lost node
since they started (:func:`~trainjob.backends.local.supervisor.rendezvous.record_loss`): their failure is then the lost
peer's. A rank that fails on its own fails the node, as with ``--max-restarts=0``, and the supervisor restarts
the node group as it does for any elastic job. Joins of returning nodes (membership changes) restart the ranks
as torchrun always does.
"""

from __future__ import annotations

import os
import sys
import time

from torch.distributed.elastic.agent.server.api import RunResult, WorkerGroup, WorkerState
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

from trainjob.backends.local.supervisor.rendezvous import JOB_DIR_ENV, losses_since

#: How long failed ranks wait for the supervisor to say whether a node was lost (it notices within 0.1 s).
LOSS_WAIT_SECONDS = 3.0
_POLL_SECONDS = 0.1


class ShrinkingAgent(LocalElasticAgent):
    """A ``LocalElasticAgent`` that restarts its ranks after a failure only when a peer node was lost."""

    _round_started = 0.0

    def _initialize_workers(self, worker_group: WorkerGroup) -> None:
        self._round_started = time.time()
        super()._initialize_workers(worker_group)

    def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        result = super()._monitor_workers(worker_group)
        failed = result.state in (WorkerState.FAILED, WorkerState.UNHEALTHY)
        if failed and self._remaining_restarts > 0 and not self._peer_lost():
            self._remaining_restarts = 0  # fail the node: the supervisor decides what happens next
        return result

    def _peer_lost(self) -> bool:
        job_dir = os.environ.get(JOB_DIR_ENV)
        if not job_dir:
            return True
        deadline = time.monotonic() + LOSS_WAIT_SECONDS
        while True:
            if losses_since(job_dir, self._round_started - 1.0):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(_POLL_SECONDS)


def main() -> None:
    import torch.distributed.launcher.api as launcher_api
    from torch.distributed.run import main as torchrun_main

    launcher_api.LocalElasticAgent = ShrinkingAgent  # type: ignore[misc]  # what launch_agent instantiates
    torchrun_main(sys.argv[1:])


if __name__ == "__main__":
    main()
