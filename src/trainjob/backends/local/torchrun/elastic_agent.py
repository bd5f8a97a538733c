"""``torchrun`` for the nodes of a shrinkable local job: ``python -m trainjob.backends.local.torchrun.elastic_agent ARGS``.

The same as ``torchrun ARGS`` but for what a lost node means. The supervisor notices a node's loss from its
keeper's exit and records it (:func:`~trainjob.backends.local.supervisor.rendezvous.record_loss`, with how many
nodes go on); every agent of the others then:

- **restarts its ranks at once**, at the smaller size, rather than when they fail on the lost peer (a collective
  may take a while to fail, and a failed rank a while to exit);
- **drops the lost node from the rendezvous** as soon as its agent's process is gone (every node of a local job
  runs on this machine, so that is known for sure), rather than after its heartbeat lapses
  (``keep_alive_interval x keep_alive_max_attempt``, 4 s, in
  :data:`~trainjob.backends.local.supervisor.rendezvous.RDZV_CONF`);
- **closes the new round once the nodes that go on have all joined** it, rather than after ``last_call_timeout``,
  and looks at the round every 0.05 s rather than every second while it forms.

Only the round right after a loss is closed early. A node group's first round waits for every node the supervisor
started (they all start at once; on a busy machine one may join seconds after the others), up to
:data:`FIRST_ROUND_SECONDS`, rather than starting without the late ones after the short last call. Every other
round (a returning node's) forms as torchrun's own do. A rank that fails on its own (no loss recorded since its
round started) fails the node, as with ``--max-restarts=0``, and the supervisor restarts the node group as it does
for any elastic job. Joins of returning nodes (membership changes) restart the ranks as torchrun always does.

This reaches into torch's dynamic rendezvous (``torch.distributed.elastic.rendezvous.dynamic_rendezvous``, torch
2.13); should its internals change, what cannot be found is left alone and a loss takes the heartbeat's time.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from torch.distributed.elastic.agent.server.api import RunResult, WorkerGroup, WorkerState
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.rendezvous import dynamic_rendezvous

from trainjob.backends.local.supervisor.rendezvous import losses_since
from trainjob.constants import JOB_DIR_ENV

#: How long failed ranks wait for the supervisor to say whether a node was lost (it notices within 0.1 s).
LOSS_WAIT_SECONDS = 3.0
_POLL_SECONDS = 0.1
#: How long a node group's first round waits for the nodes started with it, counted from when ``min_nodes`` of them
#: joined (torch's default ``last_call_timeout``); the rounds after it close after the short last call of
#: :data:`~trainjob.backends.local.supervisor.rendezvous.RDZV_CONF`.
FIRST_ROUND_SECONDS = 30.0
#: How often an agent looks at the rendezvous state while the round after a loss forms (torch: every second).
ROUND_POLL_SECONDS = 0.05
#: How many times dropping a lost node from the rendezvous state is tried against other agents' writes.
_DROP_ATTEMPTS = 20

#: Nodes that go on after the loss being recovered from: the round closes once this many joined (else ``None``).
_closing_at: int | None = None
_torch_delay = dynamic_rendezvous._delay


class ShrinkingAgent(LocalElasticAgent):
    """A ``LocalElasticAgent`` that restarts its ranks when a peer node was lost, and only then after a failure."""

    _round_started = 0.0
    _recovering: list[dict[str, Any]] | None = None
    #: Losses already recovered from (by time and node): a loss recorded late, after the round it caused began,
    #: must not restart that round again.
    _handled: frozenset[tuple[Any, Any]] = frozenset()

    def _initialize_workers(self, worker_group: WorkerGroup) -> None:
        global _closing_at
        losses, self._recovering = self._recovering, None
        if losses:
            self._handled = self._handled | {(loss.get("time"), loss.get("node")) for loss in losses}
        handler = worker_group.spec.rdzv_handler
        holder = getattr(handler, "_state_holder", None)
        cached = getattr(holder, "_cache_duration", None)
        if losses:
            remaining = [loss["remaining"] for loss in losses if isinstance(loss.get("remaining"), int)]
            _closing_at = remaining[-1] if remaining else None
            _drop_dead_nodes(handler)
            if _closing_at is not None and cached is not None:
                holder._cache_duration = 0  # each look at the forming round reads it (torch: at most once a second)
        self._round_started = time.time()
        try:
            super()._initialize_workers(worker_group)
        finally:
            _closing_at = None
            if cached is not None:
                holder._cache_duration = cached

    def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        result = super()._monitor_workers(worker_group)
        if result.state == WorkerState.HEALTHY and self._remaining_restarts > 0:
            losses = self._losses(since=self._round_started)
            if losses:  # a peer is gone: the ranks cannot go on in this round
                self._recovering = losses
                return RunResult(state=WorkerState.UNHEALTHY)
            return result
        failed = result.state in (WorkerState.FAILED, WorkerState.UNHEALTHY)
        if failed and self._remaining_restarts > 0 and os.environ.get(JOB_DIR_ENV):  # else: as torchrun does
            losses = self._wait_for_losses()
            if losses:
                self._recovering = losses
            else:
                self._remaining_restarts = 0  # fail the node: the supervisor decides what happens next
        return result

    def _losses(self, since: float) -> list[dict[str, Any]]:
        """Losses recorded since ``since`` that no earlier round has recovered from."""
        job_dir = os.environ.get(JOB_DIR_ENV)
        found = losses_since(job_dir, since) if job_dir else []
        return [loss for loss in found if (loss.get("time"), loss.get("node")) not in self._handled]

    def _wait_for_losses(self) -> list[dict[str, Any]]:
        """The losses recorded since this round started (waiting a little for the supervisor to record one)."""
        deadline = time.monotonic() + LOSS_WAIT_SECONDS
        while True:
            losses = self._losses(since=self._round_started - 1.0)
            if losses:
                return losses
            if time.monotonic() >= deadline:
                return []
            time.sleep(_POLL_SECONDS)


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _drop_dead_nodes(handler: Any) -> None:
    """Remove from the rendezvous state the nodes of this machine whose agent process is gone.

    Their last heartbeat is set far in the past, so every agent's next read of the state removes them the way
    torch removes a node whose heartbeat lapsed (participants, wait list, the round's bookkeeping).
    """
    holder = getattr(handler, "_state_holder", None)
    me = getattr(handler, "_this_node", None)
    if holder is None or me is None:
        return
    lapsed = datetime(1970, 1, 1, tzinfo=UTC)  # torch keeps aware datetimes
    with contextlib.suppress(Exception):  # a rendezvous that cannot be read now is left to the heartbeats
        for _ in range(_DROP_ATTEMPTS):
            holder.mark_dirty()
            holder.sync()  # writes the copy this agent holds, or, when it is stale, reads the current one
            heartbeats = holder.state.last_heartbeats
            dead = [node for node in heartbeats if node.addr == me.addr and node != me and not _alive(node.pid)]
            if not dead:
                return
            for node in dead:
                heartbeats[node] = lapsed
            holder.mark_dirty()
            if holder.sync():
                return


class _ClosingJoinOp(dynamic_rendezvous._RendezvousJoinOp):  # type: ignore[misc]
    """torch's join, which also closes the round after a loss once the nodes that go on have all joined it, and
    keeps a node group's first round open for every node the supervisor started (up to
    :data:`FIRST_ROUND_SECONDS` after ``min_nodes`` joined)."""

    def __call__(self, ctx: Any, deadline: float) -> Any:
        action = super().__call__(ctx, deadline)
        state = ctx.state
        if (
            action == dynamic_rendezvous._Action.MARK_RENDEZVOUS_COMPLETE
            and _closing_at is None
            and state.round == 0
            and len(state.participants) < ctx.settings.max_nodes
            and state.deadline is not None
            and datetime.now(UTC) < state.deadline + timedelta(seconds=FIRST_ROUND_SECONDS)
            and not _loss_recorded()  # a node lost before it joined is not waited for
        ):
            # Every node of the group was started at once: one that is late (a machine busier than its cores, a
            # slow import) belongs in the first round. Closed after the short last call, the round would start
            # without it; ranks that finish before it joins close the rendezvous, and the late node fails on it.
            keep_alive = dynamic_rendezvous._should_keep_alive(ctx)
            return dynamic_rendezvous._Action.KEEP_ALIVE if keep_alive else dynamic_rendezvous._Action.SYNC
        if (
            _closing_at is not None
            and action == dynamic_rendezvous._Action.SYNC
            and not state.complete
            and ctx.node in state.participants
            and len(state.participants) >= max(_closing_at, ctx.settings.min_nodes)
        ):
            return dynamic_rendezvous._Action.MARK_RENDEZVOUS_COMPLETE
        return action


_AGENT_STARTED = time.time()


def _loss_recorded() -> bool:
    """Whether the supervisor recorded a lost node since this agent started."""
    job_dir = os.environ.get(JOB_DIR_ENV)
    return bool(job_dir and losses_since(job_dir, _AGENT_STARTED))


def _delay(seconds: float | tuple[float, float]) -> None:
    """torch's pause between looks at a forming round, shortened while the round after a loss forms."""
    if _closing_at is not None and seconds == 1:
        time.sleep(ROUND_POLL_SECONDS)
    else:
        _torch_delay(seconds)


def main() -> None:
    import torch.distributed.launcher.api as launcher_api
    from torch.distributed.run import main as torchrun_main

    launcher_api.LocalElasticAgent = ShrinkingAgent  # type: ignore[misc]  # what launch_agent instantiates
    dynamic_rendezvous._RendezvousJoinOp = _ClosingJoinOp  # what next_rendezvous instantiates
    dynamic_rendezvous._delay = _delay
    torchrun_main(sys.argv[1:])


if __name__ == "__main__":
    main()
