"""The agent of a shrinkable node after a loss: it restarts its ranks at once, drops the lost node from the
rendezvous when its process is gone, and closes the next round once the nodes that go on have joined."""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime, timedelta

import pytest
from torch.distributed.elastic.agent.server.api import RunResult, WorkerState
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
    RendezvousSettings,
    RendezvousTimeout,
    _Action,
    _NodeDesc,
    _RendezvousContext,
    _RendezvousState,
)

from trainjob.backends.local.supervisor.rendezvous import record_loss
from trainjob.backends.local.torchrun import elastic_agent
from trainjob.backends.local.torchrun.elastic_agent import ShrinkingAgent, _ClosingJoinOp, _drop_dead_nodes
from trainjob.constants import JOB_DIR_ENV

#: Above the largest pid_max Linux allows (2**22): no process has it.
NO_SUCH_PID = 2**22 + 1


@pytest.fixture
def agent(tmp_path, monkeypatch):
    """A shrinking agent whose ranks are healthy, in a round that started a moment ago."""
    monkeypatch.setenv(JOB_DIR_ENV, str(tmp_path))
    monkeypatch.setattr(LocalElasticAgent, "_monitor_workers", lambda self, group: RunResult(WorkerState.HEALTHY))
    agent = object.__new__(ShrinkingAgent)
    agent._remaining_restarts = 3
    agent._round_started = time.time()
    return agent


def test_a_loss_recorded_in_this_round_restarts_healthy_ranks_at_once(agent, tmp_path):
    assert agent._monitor_workers(None).state == WorkerState.HEALTHY

    record_loss(tmp_path, 1, "killed by SIGKILL", remaining=2)

    assert agent._monitor_workers(None).state == WorkerState.UNHEALTHY
    assert [(loss["node"], loss["remaining"]) for loss in agent._recovering] == [(1, 2)]


def test_a_loss_from_before_the_round_restarts_nothing(agent, tmp_path):
    record_loss(tmp_path, 1, "killed by SIGKILL", remaining=2)
    agent._round_started = time.time() + 1

    assert agent._monitor_workers(None).state == WorkerState.HEALTHY
    assert agent._recovering is None


def test_ranks_that_fail_with_no_loss_recorded_fail_the_node(agent, monkeypatch):
    monkeypatch.setattr(LocalElasticAgent, "_monitor_workers", lambda self, group: RunResult(WorkerState.FAILED))
    monkeypatch.setattr(elastic_agent, "LOSS_WAIT_SECONDS", 0)

    assert agent._monitor_workers(None).state == WorkerState.FAILED
    assert agent._remaining_restarts == 0


class Holder:
    """The part of torch's rendezvous state holder the agent uses: a state, ``mark_dirty`` and ``sync``."""

    def __init__(self, state: _RendezvousState) -> None:
        self.state = state
        self.written: list[dict] = []
        self.dirty = False

    def mark_dirty(self) -> None:
        self.dirty = True

    def sync(self) -> bool | None:
        if not self.dirty:
            return None
        self.written.append(dict(self.state.last_heartbeats))
        self.dirty = False
        return True


class Handler:
    def __init__(self, me: _NodeDesc, holder: Holder) -> None:
        self._this_node, self._state_holder = me, holder


def test_nodes_of_this_machine_whose_agent_is_gone_lose_their_heartbeat():
    me = _NodeDesc("host", os.getpid(), 0)
    alive = _NodeDesc("host", os.getppid(), 0)
    gone = _NodeDesc("host", NO_SUCH_PID, 0)
    elsewhere = _NodeDesc("other-host", NO_SUCH_PID, 0)
    state = _RendezvousState()
    now = datetime.now(UTC)
    state.last_heartbeats = {me: now, alive: now, gone: now, elsewhere: now}
    holder = Holder(state)

    _drop_dead_nodes(Handler(me, holder))

    written = holder.written[-1]
    assert written[gone].year == 1970, "lapsed: every agent's next read removes it"
    assert written[me] == written[alive] == written[elsewhere] == now


def settings(min_nodes: int = 2, max_nodes: int = 3) -> RendezvousSettings:
    return RendezvousSettings("job", min_nodes, max_nodes, RendezvousTimeout(last_call=timedelta(seconds=30)),
                              timedelta(seconds=1), 4)


def forming_round(*nodes: _NodeDesc) -> _RendezvousState:
    state = _RendezvousState()
    state.participants = dict.fromkeys(nodes, 0)
    state.last_heartbeats = dict.fromkeys(nodes, datetime.now(UTC))
    state.deadline = datetime.now(UTC) + timedelta(seconds=30)
    return state


@pytest.mark.parametrize(("closing_at", "joined", "action"), [
    (2, 2, _Action.MARK_RENDEZVOUS_COMPLETE),  # every node that goes on has joined: no last call
    (2, 1, _Action.SYNC),  # below minNodes: wait
    (3, 2, _Action.SYNC),  # one that goes on has not joined yet: wait for it
    (None, 2, _Action.SYNC),  # not after a loss: torch's last call
])
def test_the_round_after_a_loss_closes_once_the_nodes_that_go_on_joined(monkeypatch, closing_at, joined, action):
    monkeypatch.setattr(elastic_agent, "_closing_at", closing_at)
    nodes = [_NodeDesc("host", 100 + i, 0) for i in range(joined)]
    context = _RendezvousContext(nodes[0], forming_round(*nodes), settings())

    assert _ClosingJoinOp()(context, time.monotonic() + 60) == action
