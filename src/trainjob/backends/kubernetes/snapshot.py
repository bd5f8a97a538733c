"""The runtime snapshot a TrainJob runs on, signed so that only the operator can have written it.

The operator copies the referenced runtime into the ``trainer.kubeflow.org/runtime-snapshot`` annotation of the
JobSet it builds from it (in the same create, so the snapshot costs no request of its own), so that editing the
runtime later never changes a started job: a JobSet deleted by someone else is built again from the snapshot its
deletion event carried. Annotations are writable by whoever may create the TrainJob (or edit the JobSet), so an
unsigned snapshot would let any such user choose the pod template (privileged, host namespaces, host paths,
another service account) and bypass the runtime the platform team wrote. The operator therefore signs each
snapshot with HMAC-SHA256 over the TrainJob's namespace, name and uid and the snapshot text
(``trainer.kubeflow.org/runtime-snapshot-signature``), with a key only it can read:

- a snapshot without a valid signature (user-written on the TrainJob, copied from another job, edited,
  unreadable) is ignored: the operator takes a fresh one from the referenced runtime; one written on the TrainJob
  is overwritten by the signed snapshot, with a ``Warning`` Event (``RuntimeSnapshotReplaced``);
- a signed snapshot on the TrainJob itself is honoured too (:meth:`.children.Children.snapshot`);
- the key lives in the Secret ``trainjob-operator-snapshot-key`` of the operator's namespace, created by the
  operator with 32 random bytes the first time it starts, so snapshots stay valid across restarts::

    signer = SnapshotSigner(load_or_create_key(api, "trainjob-system"))
    snapshot = signer.verified(job, jobset)     # dict, or None when absent or not the operator's
    jobset["metadata"]["annotations"].update(signer.annotations(job, snapshot))
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from typing import TYPE_CHECKING, Any

from trainjob.backends.kubernetes.kubeapi import ApiError
from trainjob.backends.kubernetes.resources import RUNTIME_SNAPSHOT_ANNOTATION, SECRETS
from trainjob.errors import AlreadyExistsError, BackendError

if TYPE_CHECKING:
    from trainjob.backends.kubernetes.kubeapi import KubeApi

SIGNATURE_ANNOTATION = f"{RUNTIME_SNAPSHOT_ANNOTATION}-signature"
KEY_SECRET = "trainjob-operator-snapshot-key"
_KEY_FIELD = "key"


class SnapshotSigner:
    """Signs and verifies runtime snapshots of TrainJobs with one secret key."""

    def __init__(self, key: bytes) -> None:
        if len(key) < 16:
            raise ValueError("the snapshot key must be at least 16 bytes")
        self._key = key

    def _signature(self, job: dict[str, Any], text: str) -> str:
        meta = job["metadata"]
        message = f"{meta['namespace']}/{meta['name']}/{meta['uid']}\n{text}".encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def annotations(self, job: dict[str, Any], snapshot: dict[str, Any]) -> dict[str, str]:
        """The two annotations that record ``snapshot`` for ``job``."""
        text = json.dumps(snapshot, sort_keys=True, separators=(",", ":"))
        return {RUNTIME_SNAPSHOT_ANNOTATION: text, SIGNATURE_ANNOTATION: self._signature(job, text)}

    def verified(self, job: dict[str, Any], carrier: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """The job's snapshot if this operator wrote it; ``None`` when absent, unsigned, forged or unreadable.
        ``carrier``: the object whose annotations hold it (the job's JobSet), else the job itself."""
        annotations = ((carrier if carrier is not None else job).get("metadata") or {}).get("annotations") or {}
        text, signature = annotations.get(RUNTIME_SNAPSHOT_ANNOTATION), annotations.get(SIGNATURE_ANNOTATION)
        if not isinstance(text, str) or not isinstance(signature, str):
            return None
        if not hmac.compare_digest(self._signature(job, text), signature):
            return None
        try:
            snapshot = json.loads(text)
        except ValueError:
            return None
        return snapshot if isinstance(snapshot, dict) and isinstance(snapshot.get("spec"), dict) else None


def has_snapshot(job: dict[str, Any]) -> bool:
    """Whether the job carries a snapshot annotation at all (verified or not)."""
    return RUNTIME_SNAPSHOT_ANNOTATION in ((job.get("metadata") or {}).get("annotations") or {})


def load_or_create_key(api: KubeApi, namespace: str) -> bytes:
    """The operator's snapshot key from Secret ``namespace/trainjob-operator-snapshot-key``, created if missing."""
    for _ in range(3):
        try:
            secret = api.read_secret(namespace, KEY_SECRET)
        except ApiError as exc:
            raise BackendError(
                f"cannot read the operator's snapshot key (Secret {namespace}/{KEY_SECRET}): {exc}; the "
                "operator's Role must allow `get` on it"
            ) from exc
        if secret is not None:
            try:
                return base64.b64decode((secret.get("data") or {})[_KEY_FIELD])
            except KeyError as exc:
                raise BackendError(f"Secret {namespace}/{KEY_SECRET} has no {_KEY_FIELD!r} entry") from exc
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": KEY_SECRET, "namespace": namespace},
            "type": "Opaque",
            "data": {_KEY_FIELD: base64.b64encode(secrets.token_bytes(32)).decode()},
        }
        try:
            api.create(body, SECRETS)
        except AlreadyExistsError:  # another operator created it first; read that one
            continue
        except ApiError as exc:
            raise BackendError(
                f"cannot create the operator's snapshot key (Secret {namespace}/{KEY_SECRET}): {exc}"
            ) from exc
    raise BackendError(f"cannot read or create Secret {namespace}/{KEY_SECRET}")
