"""One exception hierarchy for trainjob; every message names what was wrong and what is accepted."""

from __future__ import annotations


class TrainJobError(Exception):
    """Base class of every error trainjob raises on purpose."""


class ValidationError(TrainJobError, ValueError):
    """A resource or argument is invalid.

    ``path`` is the field path (``spec.trainer.numNodes``), ``value`` the bad value and ``message`` what is
    accepted. ``str(err)`` reads ``spec.trainer.numNodes: must be >= 1, got 0``. Several problems found at once
    are kept in ``errors`` and printed one per line.
    """

    def __init__(self, path: str, message: str, *, errors: list[ValidationError] | None = None) -> None:
        self.path = path
        self.message = message
        self.errors = errors or [self]
        super().__init__(self._render())

    def _render(self) -> str:
        return "\n".join(f"{e.path}: {e.message}" if e.path else e.message for e in self.errors)

    @classmethod
    def combine(cls, errors: list[ValidationError]) -> ValidationError:
        flat = [leaf for err in errors for leaf in err.errors]
        first = flat[0]
        return cls(first.path, first.message, errors=flat)


class NotFoundError(TrainJobError, LookupError):
    """A named job or runtime does not exist."""


class AlreadyExistsError(TrainJobError):
    """A job with that name exists already."""


class JobFailedError(TrainJobError, RuntimeError):
    """A job reached ``Failed`` while a caller waited for another status."""


class BackendError(TrainJobError, RuntimeError):
    """A backend could not carry out a request (process start, API server, store)."""


class DownloadError(TrainJobError, RuntimeError):
    """A dataset or model initializer could not fetch its source (:mod:`trainjob.initializers`).

    The message names the storage URI and what the server answered (``s3://data/train: 403 AccessDenied ...``);
    ``retryable`` says whether trying again may help (a dropped connection) or not (a 403, a missing object).
    """

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        self.retryable = retryable
        super().__init__(message)


class CheckpointError(TrainJobError, RuntimeError):
    """A checkpoint could not be saved or loaded; the message names the cause and the ranks it happened on.

    ``torch.distributed.checkpoint`` reports failures as ``CheckpointException``, a ``BaseException`` that
    ``except Exception`` does not catch; :class:`trainjob.torch.Checkpointer` raises this instead.
    """


class DiskFullError(CheckpointError, OSError):
    """A checkpoint did not fit on its filesystem: ``no space left on device: PATH (needed ~X, Y free)``.

    An ``OSError`` with ``errno.ENOSPC`` and ``filename`` the checkpoint's path; ``needed`` is the checkpoint's
    estimated size and ``free`` what the filesystem had left once the unfinished checkpoint was removed (bytes,
    ``None`` when unknown), ``sizes`` the two as the message shows them.
    """

    def __init__(self, path: str, needed: int | None = None, free: int | None = None, sizes: str = "") -> None:
        import errno

        OSError.__init__(self, errno.ENOSPC, "no space left on device", path)
        self.needed, self.free, self.sizes = needed, free, sizes

    def __str__(self) -> str:
        return f"no space left on device: {self.filename}" + (f" ({self.sizes})" if self.sizes else "")

    def __reduce__(self) -> tuple[type[DiskFullError], tuple[str, int | None, int | None, str]]:
        return type(self), (self.filename, self.needed, self.free, self.sizes)


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` says a disk is full: an ``OSError`` with ``ENOSPC``, or SQLite's "database or disk is full"."""
    import errno

    if isinstance(exc, OSError):
        return exc.errno == errno.ENOSPC
    return type(exc).__module__ in ("sqlite3", "_sqlite3") and "disk is full" in str(exc)
