"""Leader election against the test cluster's API server: one leader at a time, takeover only after the lease
expired by the follower's own clock, at once after a release, and ``leaseTransitions`` counting the changes."""

from __future__ import annotations

import asyncio
import datetime
import itertools
import json
import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubetest.controlplane import ControlPlane, free_port

from trainjob.backends.kubernetes.kubeapi import KubeApi
from trainjob.backends.kubernetes.leader import LeaderElector, LeadershipLost

NAMESPACE = "default"
LEASE, RENEW, RETRY = 3.0, 2.0, 0.5
#: A follower's first read of a renewed lease may come a little before the leader's reply to the renewal arrives.
EARLY = 0.25
_NAMES = itertools.count()


@pytest.fixture
def admin(control_plane: ControlPlane) -> Iterator[KubeApi]:
    api = KubeApi(control_plane.client())
    yield api
    api.client.close()


@pytest.fixture
def lease_name(admin: KubeApi) -> Iterator[str]:
    import kubernetes.client

    name = f"leader-test-{next(_NAMES)}-{time.monotonic_ns() % 100000}"
    yield name
    try:
        kubernetes.client.CoordinationV1Api(admin.client).delete_namespaced_lease(name, NAMESPACE)
    except kubernetes.client.ApiException as exc:
        if exc.status != 404:
            raise


def elector(api: KubeApi, lease: str, identity: str) -> LeaderElector:
    return LeaderElector(api, NAMESPACE, lease, identity=identity, lease_duration=LEASE, renew_deadline=RENEW,
                         retry_period=RETRY)


def read_lease(api: KubeApi, name: str) -> dict[str, Any]:
    import kubernetes.client

    response = kubernetes.client.CoordinationV1Api(api.client).read_namespaced_lease(
        name, NAMESPACE, _preload_content=False)
    return dict(json.loads(response.data))


async def stop(*tasks: asyncio.Task[Any]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def test_of_two_electors_only_one_leads(admin: KubeApi, lease_name: str) -> None:
    async def scenario() -> None:
        a, b = elector(admin, lease_name, "a"), elector(admin, lease_name, "b")
        acquiring = {e.identity: asyncio.create_task(e.acquire()) for e in (a, b)}
        done, _ = await asyncio.wait(acquiring.values(), timeout=10, return_when=asyncio.FIRST_COMPLETED)
        assert len(done) == 1, "one elector should have acquired the absent lease at once"
        leader, follower = (a, b) if acquiring["a"] in done else (b, a)
        holding = asyncio.create_task(leader.hold())
        # Twice the lease duration: the leader renews all along, so the follower never gets it.
        for _ in range(int(2 * LEASE / 0.1)):
            assert leader.is_leader and not follower.is_leader
            assert not holding.done()
            await asyncio.sleep(0.1)
        assert not acquiring[follower.identity].done()
        assert follower.holder == leader.identity
        spec = read_lease(admin, lease_name)["spec"]
        assert spec["holderIdentity"] == leader.identity
        assert spec["leaseDurationSeconds"] == LEASE
        assert spec["leaseTransitions"] == 0
        await stop(holding, acquiring[follower.identity])
        await leader.release()

    asyncio.run(scenario())


def test_a_follower_takes_over_a_lease_no_longer_renewed_after_the_lease_duration(
    admin: KubeApi, lease_name: str
) -> None:
    async def scenario() -> float:
        a, b = elector(admin, lease_name, "a"), elector(admin, lease_name, "b")
        await a.acquire()
        holding = asyncio.create_task(a.hold())
        following = asyncio.create_task(b.acquire())
        await asyncio.sleep(2 * RETRY + 0.2)  # a renewed at least once while b watched
        await stop(holding)  # a dies without releasing (as if SIGKILLed)
        last_renewal = a.renewed_at
        assert last_renewal is not None
        await asyncio.wait_for(following, timeout=LEASE + 10)
        taken_over = time.monotonic()
        assert b.is_leader and b.holder == "b"
        assert b.transitions == 1
        await b.release()
        return taken_over - last_renewal

    waited = asyncio.run(scenario())
    assert waited >= LEASE - EARLY, f"b took over {waited:.2f} s after a's last renewal, before the lease expired"
    assert waited <= LEASE + (1 + 1.2) * RETRY + 2.0, f"b took over only {waited:.2f} s after a's last renewal"
    spec = read_lease(admin, lease_name)["spec"]
    assert spec["leaseTransitions"] == 1


def test_a_released_lease_is_taken_over_at_once(admin: KubeApi, lease_name: str) -> None:
    async def scenario() -> float:
        a, b = elector(admin, lease_name, "a"), elector(admin, lease_name, "b")
        await a.acquire()
        holding = asyncio.create_task(a.hold())
        following = asyncio.create_task(b.acquire())
        await asyncio.sleep(2 * RETRY)
        assert not following.done()
        await stop(holding)
        released = time.monotonic()
        await a.release()
        assert not a.is_leader
        await asyncio.wait_for(following, timeout=LEASE + 10)
        waited = time.monotonic() - released
        assert b.is_leader and b.transitions == 1
        # and back: b releases, a acquires again; every change of holder counts
        await b.release()
        await asyncio.wait_for(a.acquire(), timeout=5)
        assert a.transitions == 2
        await a.release()
        return waited

    waited = asyncio.run(scenario())
    assert waited < LEASE - 1.0, f"b needed {waited:.2f} s to take over a released lease"
    spec = read_lease(admin, lease_name)["spec"]
    assert spec["holderIdentity"] == "" and spec["leaseDurationSeconds"] == 1
    assert spec["leaseTransitions"] == 2


def test_the_followers_own_clock_decides_not_the_holders_timestamps(admin: KubeApi, lease_name: str) -> None:
    """A holder whose clock is an hour behind wrote renewTime an hour ago: the follower still waits the whole
    lease duration from when it first saw the record."""
    import kubernetes.client

    an_hour_ago = (datetime.datetime.now(tz=datetime.UTC) - datetime.timedelta(hours=1)).strftime(
        "%Y-%m-%dT%H:%M:%S.%fZ")
    kubernetes.client.CoordinationV1Api(admin.client).create_namespaced_lease(NAMESPACE, {
        "metadata": {"name": lease_name},
        "spec": {"holderIdentity": "skewed", "leaseDurationSeconds": int(LEASE), "acquireTime": an_hour_ago,
                 "renewTime": an_hour_ago, "leaseTransitions": 4},
    })

    async def scenario() -> float:
        b = elector(admin, lease_name, "b")
        started = time.monotonic()
        await asyncio.wait_for(b.acquire(), timeout=LEASE + 10)
        assert b.transitions == 5
        await b.release()
        return time.monotonic() - started

    waited = asyncio.run(scenario())
    assert waited >= LEASE, f"b took over after {waited:.2f} s, trusting the holder's timestamps"


def test_a_write_based_on_a_stale_read_is_refused(admin: KubeApi, lease_name: str) -> None:
    """Optimistic concurrency: a replace carrying an old resourceVersion gets 409 and wins nothing."""

    async def scenario() -> None:
        a, b = elector(admin, lease_name, "a"), elector(admin, lease_name, "b")
        await a.acquire()
        stale = read_lease(admin, lease_name)
        await asyncio.sleep(0.05)
        assert await a._try_acquire_or_renew(timeout=5)  # a renews: the resourceVersion moves on
        b._read = lambda timeout: stale  # type: ignore[method-assign]
        b._observed_at = time.monotonic() - 60  # b watched the stale record for a minute: expired, by b's clock
        b._observed = dict(stale["spec"])
        assert not await b._try_acquire_or_renew(timeout=5)
        assert read_lease(admin, lease_name)["spec"]["holderIdentity"] == "a"
        await a.release()

    asyncio.run(scenario())


def test_a_leader_that_sees_another_holder_stops_at_once(admin: KubeApi, lease_name: str) -> None:
    async def scenario() -> None:
        a = elector(admin, lease_name, "a")
        await a.acquire()
        lease = read_lease(admin, lease_name)
        lease["spec"]["holderIdentity"] = "intruder"
        import kubernetes.client

        await asyncio.to_thread(
            kubernetes.client.CoordinationV1Api(admin.client).replace_namespaced_lease, lease_name, NAMESPACE, lease)
        started = time.monotonic()
        with pytest.raises(LeadershipLost, match="intruder holds it now"):
            await asyncio.wait_for(a.hold(), timeout=RENEW + 5)
        assert time.monotonic() - started < RENEW
        assert not a.is_leader

    asyncio.run(scenario())


def test_a_leader_that_cannot_renew_gives_up_within_the_renew_deadline(
    control_plane: ControlPlane, lease_name: str
) -> None:
    """The API server becomes unreachable for the leader: it stops leading after renew_deadline, before any
    follower could take over (lease_duration)."""
    api = KubeApi(control_plane.client())

    async def scenario() -> float:
        a = elector(api, lease_name, "a")
        await a.acquire()
        holding = asyncio.create_task(a.hold())
        await asyncio.sleep(2 * RETRY)
        api.client.configuration.host = f"https://127.0.0.1:{free_port()}"  # nothing listens there
        with pytest.raises(LeadershipLost, match=f"no renewal succeeded within {RENEW:g} s"):
            await asyncio.wait_for(holding, timeout=RENEW + 5)
        gave_up = time.monotonic()
        assert not a.is_leader
        assert a.renewed_at is not None
        return gave_up - a.renewed_at

    try:
        waited = asyncio.run(scenario())
    finally:
        api.client.close()
    assert RENEW - 0.1 <= waited < LEASE - EARLY, f"a gave up {waited:.2f} s after its last renewal"


def test_a_replica_without_rights_on_leases_keeps_trying_and_says_why_once(
    control_plane: ControlPlane, lease_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    kubeconfig = control_plane.service_account_kubeconfig(NAMESPACE, "leader-test-no-rights")
    api = KubeApi(control_plane.client(kubeconfig))

    async def scenario() -> None:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(elector(api, lease_name, "a").acquire(), timeout=4 * RETRY * 2.2)

    try:
        with caplog.at_level(logging.WARNING, logger="trainjob.operator"):
            asyncio.run(scenario())
    finally:
        api.client.close()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert f"cannot read lease {NAMESPACE}/{lease_name}: the API server answered 403" in warnings[0]


def test_settings_that_would_let_two_replicas_lead_are_refused() -> None:
    import kubernetes.client

    admin = KubeApi(kubernetes.client.ApiClient())
    with pytest.raises(ValueError, match="lease_duration: must be longer than renew_deadline"):
        LeaderElector(admin, NAMESPACE, lease_duration=5, renew_deadline=5)
    with pytest.raises(ValueError, match="renew_deadline: must be longer than"):
        LeaderElector(admin, NAMESPACE, lease_duration=15, renew_deadline=2, retry_period=2)


def test_a_leader_replaced_in_a_stall_leaves_the_new_leaders_endpoint_alone(
    admin: KubeApi, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The operator Service's EndpointSlice follows the leader (``publish_leader``). A leader stalled past its
    renew deadline learns it lost the Lease only after the follower took it and published itself: emptying the
    slice then, as a leader stepping down does, would refuse every job's reports until the next change of leader."""
    from trainjob.backends.kubernetes.manifests import LEADER_ENDPOINT_SLICE
    from trainjob.backends.kubernetes.operator import publish_leader
    from trainjob.backends.kubernetes.resources import ENDPOINT_SLICES

    def as_pod(name: str, address: str, leading: bool) -> list[list[str]]:
        monkeypatch.setenv("POD_NAME", name)
        monkeypatch.setenv("POD_IP", address)
        publish_leader(admin, namespace, leading)
        found = admin.get(ENDPOINT_SLICES, namespace, LEADER_ENDPOINT_SLICE) or {}
        return [e["addresses"] for e in found.get("endpoints") or []]

    assert as_pod("operator-a", "10.244.9.1", True) == [["10.244.9.1"]]
    assert as_pod("operator-b", "10.244.9.2", True) == [["10.244.9.2"]]  # took over the expired Lease
    assert as_pod("operator-a", "10.244.9.1", False) == [["10.244.9.2"]]  # a late: steps down, leaves b's
    assert as_pod("operator-b", "10.244.9.2", False) == []  # b stepping down empties its own
