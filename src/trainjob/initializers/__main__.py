"""``python -m trainjob.initializers dataset|model``: fill ``/workspace/dataset`` or ``/workspace/model`` from the
source in ``STORAGE_URI`` (:mod:`trainjob.initializers.config` lists the environment). Exit status 0 once the
files are in place; :data:`REFUSED_EXIT_CODE` when trying again cannot help (a 403, a 404, bad input) and 1 for
other failures, each with a one-line reason (also the pod's termination message); 2 for bad usage."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

from trainjob.errors import DownloadError, ValidationError
from trainjob.initializers.config import KINDS, InitializerConfig

TERMINATION_LOG = Path("/dev/termination-log")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0] not in KINDS:
        print(f"usage: python -m trainjob.initializers {{{'|'.join(KINDS)}}}  (got {' '.join(args) or 'nothing'})",
              file=sys.stderr)
        return 2
    from trainjob.initializers.run import initialize

    try:
        config = InitializerConfig.from_env(args[0])
        outcome = initialize(config)
    except (DownloadError, ValidationError) as exc:
        refused = isinstance(exc, ValidationError) or not exc.retryable
        return _fail(type(exc).__name__, str(exc), REFUSED_EXIT_CODE if refused else 1)
    except OSError as exc:
        return _fail(type(exc).__name__, str(exc), 1)
    print(outcome.summary(config), file=sys.stderr, flush=True)
    return 0


#: The start of the last line a failed run prints; what follows is the reason (the local supervisor reads it).
ERROR_PREFIX = "error: "


#: The exit status of a run refused for good: the operator fails the initializer's Job on it without retrying.
REFUSED_EXIT_CODE = 3


def _fail(error: str, reason: str, code: int) -> int:
    """Say why, last on stderr (``error: ...``) and, in a pod, as its termination message in the form of an
    exception line (``DownloadError: ...``), which the operator puts in the failed TrainJob's message."""
    print(f"{ERROR_PREFIX}{reason}", file=sys.stderr, flush=True)
    if TERMINATION_LOG.parent.is_dir() and TERMINATION_LOG.exists():
        with contextlib.suppress(OSError):
            TERMINATION_LOG.write_text(f"{error}: {reason}"[:4000])
    return code


if __name__ == "__main__":
    sys.exit(main())
