"""Leader election on a ``coordination.k8s.io/v1`` Lease, with client-go's ``leaderelection`` semantics, so only
one of several operator replicas reconciles at a time::

    elector = LeaderElector(api, "trainjob-system")
    await elector.acquire()          # blocks while another replica holds the lease
    try:
        await elector.hold()         # renews; raises LeadershipLost when it cannot
    finally:
        await elector.release()      # on a clean shutdown: a follower takes over at once

The Lease's ``spec`` is the record: ``holderIdentity``, ``leaseDurationSeconds``, ``acquireTime``, ``renewTime``,
``leaseTransitions``. Every write replaces the Lease with the ``resourceVersion`` just read, so of two replicas
writing at once the API server accepts one and answers 409 to the other, which then reads again.

A follower never compares the holder's timestamps with its own clock (the clocks of two machines differ). Like
client-go, it notes on its own monotonic clock when it last saw the record change, and takes over only when the
record has stayed unchanged for ``leaseDurationSeconds`` since then, or at once when ``holderIdentity`` is empty
(a released lease).

Settings (client-go's names and defaults):

- ``lease_duration`` (15 s): how long followers wait after the last change of the record they saw before taking
  over; written into the Lease as ``leaseDurationSeconds``.
- ``renew_deadline`` (10 s): the leader gives up when no renewal succeeded for this long; shorter than
  ``lease_duration``, so it stops before a follower can take over.
- ``retry_period`` (2 s): how often the leader renews and followers try (followers with up to 120 % jitter, so
  they do not all ask at once).
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import math
import random
import socket
import time
import uuid
from collections.abc import Callable
from typing import Any

from trainjob.backends.kubernetes.kubeapi import ApiError, KubeApi
from trainjob.backends.kubernetes.resources import LEASES
from trainjob.errors import AlreadyExistsError, BackendError

log = logging.getLogger("trainjob.operator")

#: A follower waits ``retry_period * (1 + random() * JITTER_FACTOR)`` between tries, as client-go does.
JITTER_FACTOR = 1.2


class LeadershipLost(BackendError):
    """This replica could not renew its lease in time, or another replica holds it now: stop reconciling."""


class LeaderElector:
    """Acquires, renews and releases the Lease ``namespace/name`` for ``identity``."""

    def __init__(
        self,
        api: KubeApi,
        namespace: str,
        name: str = "trainjob-operator",
        identity: str | None = None,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if lease_duration <= renew_deadline:
            raise ValueError(
                f"lease_duration: must be longer than renew_deadline ({renew_deadline:g} s), got {lease_duration:g} s"
            )
        if renew_deadline <= JITTER_FACTOR * retry_period:
            raise ValueError(
                f"renew_deadline: must be longer than {JITTER_FACTOR:g} x retry_period "
                f"({JITTER_FACTOR * retry_period:g} s), got {renew_deadline:g} s"
            )
        self.namespace = namespace
        self.name = name
        self.identity = identity or f"{socket.gethostname()}_{uuid.uuid4()}"
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self.clock = clock
        self.api = api
        self._observed: dict[str, Any] = {}  # the lease's spec as last read or written
        self._observed_at = 0.0  # clock() when the record was last seen to change
        self._lease: dict[str, Any] | None = None  # the whole Lease this replica last wrote (for release)
        self._leading = False
        self._renewed_at: float | None = None

    @property
    def is_leader(self) -> bool:
        """Whether this replica holds the lease (from a successful :meth:`acquire` until it is lost or released)."""
        return self._leading

    @property
    def holder(self) -> str | None:
        """Who held the lease when it was last read (``None``: nobody, or not read yet)."""
        return self._observed.get("holderIdentity") or None

    @property
    def transitions(self) -> int:
        """The lease's ``leaseTransitions`` when it was last read: how often its holder changed."""
        return int(self._observed.get("leaseTransitions") or 0)

    @property
    def renewed_at(self) -> float | None:
        """``clock()`` when this replica last acquired or renewed the lease."""
        return self._renewed_at

    async def acquire(self) -> None:
        """Return once this replica holds the lease; meanwhile log who holds it whenever that changes."""
        reported: tuple[str | None, str | None] | None = None
        while True:
            error = None
            try:
                if await self._try_acquire_or_renew(timeout=self.renew_deadline):
                    break
            except Exception as exc:  # unreachable, forbidden ...: keep trying, as client-go does
                error = str(exc)
            if (self.holder, error) != reported and (self.holder or error):
                reported = (self.holder, error)
                if error:
                    log.warning("%s (retrying every %g s)", error, self.retry_period)
                else:
                    log.info("lease %s/%s is held by %s; waiting for it to expire", self.namespace, self.name,
                             self.holder)
            await asyncio.sleep(self.retry_period * (1 + random.random() * JITTER_FACTOR))
        self._leading = True
        log.info("%s acquired lease %s/%s (transitions: %d)", self.identity, self.namespace, self.name,
                 self.transitions)

    async def hold(self) -> None:
        """Renew the lease every ``retry_period`` until cancelled (cancelling does not release it).

        Raises :class:`LeadershipLost` when no renewal succeeded for ``renew_deadline`` since the last one, or
        at once when the lease shows another holder."""
        if not self._leading:
            raise LeadershipLost(f"{self.identity} does not hold lease {self.namespace}/{self.name}")
        while True:
            await asyncio.sleep(self.retry_period)
            deadline = (self._renewed_at or 0.0) + self.renew_deadline
            while True:
                remaining = deadline - self.clock()
                if remaining <= 0:
                    self._lose(f"no renewal succeeded within {self.renew_deadline:g} s")
                ok = False
                try:
                    ok = await asyncio.wait_for(self._try_acquire_or_renew(timeout=remaining), remaining)
                except TimeoutError:
                    log.warning("renewing lease %s/%s timed out", self.namespace, self.name)
                except Exception as exc:
                    log.warning("renewing lease %s/%s failed (retrying): %s", self.namespace, self.name, exc)
                if ok:
                    break
                if self.holder not in (None, self.identity):
                    self._lose(f"{self.holder} holds it now")
                await asyncio.sleep(max(min(self.retry_period, deadline - self.clock()), 0.0))

    async def release(self) -> None:
        """Give the lease up (``holderIdentity`` empty, ``leaseDurationSeconds`` 1) so a follower takes over at
        once; a no-op when this replica does not hold it."""
        if not self._leading or self._lease is None:
            return
        self._leading = False
        now = _micro_time()
        lease, self._lease = dict(self._lease), None
        lease["spec"] = {
            "holderIdentity": "",
            "leaseDurationSeconds": 1,
            "acquireTime": now,
            "renewTime": now,
            "leaseTransitions": self.transitions,
        }
        try:
            written = await asyncio.to_thread(self._write, lease, self.renew_deadline)
        except Exception as exc:
            log.warning("releasing lease %s/%s failed (it expires by itself): %s", self.namespace, self.name, exc)
            return
        if written is not None:
            self._observe(written, self.clock())
            log.info("%s released lease %s/%s", self.identity, self.namespace, self.name)

    # -- one try, as client-go's tryAcquireOrRenew ----------------------------------------------------------------

    async def _try_acquire_or_renew(self, timeout: float) -> bool:
        lease = await asyncio.to_thread(self._read, timeout)
        now = _micro_time()
        if lease is None:
            spec = self._spec(acquire_time=now, renew_time=now, transitions=0)
            lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                     "metadata": {"name": self.name, "namespace": self.namespace}, "spec": spec}
            written = await asyncio.to_thread(self._write, lease, timeout, True)
        else:
            old = lease.get("spec") or {}
            if _record(old) != _record(self._observed):
                self._observe(lease, self.clock())
            holder = old.get("holderIdentity") or ""
            if holder and holder != self.identity and self._observed_lease_valid():
                return False
            if holder == self.identity:
                spec = self._spec(old.get("acquireTime") or now, now, int(old.get("leaseTransitions") or 0))
            else:
                spec = self._spec(now, now, int(old.get("leaseTransitions") or 0) + 1)
            written = await asyncio.to_thread(self._write, {**lease, "spec": spec}, timeout)
        if written is None:  # 409: another replica wrote first
            return False
        self._renewed_at = self.clock()
        self._observe(written, self._renewed_at)
        return True

    def _spec(self, acquire_time: str, renew_time: str, transitions: int) -> dict[str, Any]:
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, math.ceil(self.lease_duration)),  # whole seconds; never shorter
            "acquireTime": acquire_time,
            "renewTime": renew_time,
            "leaseTransitions": transitions,
        }

    def _observed_lease_valid(self) -> bool:
        duration = float(self._observed.get("leaseDurationSeconds") or 0)
        return self._observed_at + duration > self.clock()

    def _observe(self, lease: dict[str, Any], at: float) -> None:
        self._observed = dict(lease.get("spec") or {})
        self._observed_at = at
        if self._observed.get("holderIdentity") == self.identity:
            self._lease = lease

    def _lose(self, why: str) -> None:
        self._leading = False
        raise LeadershipLost(f"{self.identity} lost lease {self.namespace}/{self.name}: {why}")

    # -- blocking calls (run in a thread) ---------------------------------------------------------------------

    def _read(self, timeout: float) -> dict[str, Any] | None:
        try:
            return self.api.get(LEASES, self.namespace, self.name, timeout=timeout)
        except ApiError as exc:
            raise ApiError(f"cannot read lease {self.namespace}/{self.name}: {exc.answer}", exc.status,
                           exc.answer) from exc

    def _write(self, lease: dict[str, Any], timeout: float, create: bool = False) -> dict[str, Any] | None:
        """Create or replace (with the ``resourceVersion`` in ``lease``); ``None`` on a conflict."""
        try:
            if create:
                return self.api.create(lease, LEASES, timeout=timeout)
            return self.api.replace(lease, LEASES, timeout=timeout)
        except AlreadyExistsError:
            return None
        except ApiError as exc:
            if exc.status == 409:
                return None
            raise ApiError(f"cannot {'create' if create else 'update'} lease {self.namespace}/{self.name}: "
                           f"{exc.answer}", exc.status, exc.answer) from exc


def _record(spec: dict[str, Any]) -> tuple[Any, ...]:
    keys = ("holderIdentity", "leaseDurationSeconds", "acquireTime", "renewTime", "leaseTransitions")
    return tuple(spec.get(key) for key in keys)


def _micro_time() -> str:
    """Now as a Kubernetes ``MicroTime`` (RFC 3339 with exactly six fractional digits)."""
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
