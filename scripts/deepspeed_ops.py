"""Compile DeepSpeed's CPU ops (CPU Adam, shared-memory comm) once per machine, outside the tests' time.

DeepSpeed's only release is a source one, installed without its ops (``DS_BUILD_OPS=0``), so the first job that needs
one compiles it with torch's extension loader: minutes on 2 cores. This builds both into a cache keyed by the torch
and DeepSpeed versions and prints the directory; a job (or test) that sets ``TORCH_EXTENSIONS_DIR`` to it loads them
at once. A second run finds them built and takes a second::

    .venv/bin/python scripts/deepspeed_ops.py          # prints ~/.cache/trainjob/torch_extensions/torch-...-ds-...

The cache root is ``$TRAINJOB_OPS_CACHE`` (default ``~/.cache/trainjob/torch_extensions``). Builds of one cache are
serialized with a lock, so parallel runs wait for each other instead of compiling into the same directory.
"""

from __future__ import annotations

import fcntl
import os
import sys
from pathlib import Path

OPS = ("CPUAdamBuilder", "ShareMemCommBuilder")


def cache_dir() -> Path:
    import deepspeed
    import torch

    root = Path(os.environ.get("TRAINJOB_OPS_CACHE") or Path.home() / ".cache" / "trainjob" / "torch_extensions")
    return root / f"torch-{torch.__version__}-ds-{deepspeed.__version__}-py{sys.version_info[0]}{sys.version_info[1]}"


def main() -> int:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    try:
        directory = cache_dir()
    except ImportError as exc:
        print(f"deepspeed_ops.py: {exc}; nothing to build", file=sys.stderr)
        return 0
    directory.mkdir(parents=True, exist_ok=True)
    os.environ["TORCH_EXTENSIONS_DIR"] = str(directory)
    stdout = os.dup(1)
    os.dup2(2, 1)  # DeepSpeed's and the compiler's chatter to stderr: stdout says only where the ops are
    try:
        from deepspeed.accelerator import get_accelerator

        with open(directory.parent / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            for name in OPS:
                get_accelerator().create_op_builder(name).load(verbose=False)
    finally:
        sys.stdout.flush()
        os.dup2(stdout, 1)
    print(directory)
    return 0


if __name__ == "__main__":
    sys.exit(main())
