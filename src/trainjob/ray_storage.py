"""Where Ray Train may write checkpoints, checked before a job runs: ``RunConfig(storage_path=...)`` of the driver.

Checked twice: at submit by the Ray runtime plugin (:mod:`trainjob.runtime.plugins.ray`), and on node 0 before the
driver starts (:mod:`trainjob.ray.node`), so it lives below both.

=====================  ===========================================================================
``storage_path``       accepted when
=====================  ===========================================================================
a path, ``file://``    always (a local path, or a volume mounted on every node)
``s3://``              ``pyarrow`` with its S3 filesystem is installed (``pyarrow._s3fs``)
``gs://``, ``gcs://``  ``pyarrow`` with its GCS filesystem is installed (``pyarrow._gcsfs``)
anything else          never: Ray Train reaches storage through pyarrow, which has no such scheme
=====================  ===========================================================================

Only literal strings are seen (``storage_path="s3://bucket/runs"`` in the script); a path computed at run time is
Ray's to check when the driver starts.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

#: The modules each remote scheme needs.
SCHEME_MODULES: dict[str, tuple[str, ...]] = {
    "s3": ("pyarrow", "pyarrow._s3fs"),
    "gs": ("pyarrow", "pyarrow._gcsfs"),
    "gcs": ("pyarrow", "pyarrow._gcsfs"),
}
ACCEPTED = "a local or mounted path, file://, s3:// or gs:// (with pyarrow installed)"


def storage_paths(script: Path) -> list[str]:
    """The literal ``storage_path=`` values in ``script`` (none if it cannot be read or parsed)."""
    try:
        tree = ast.parse(script.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return []
    return [
        node.value.value
        for node in ast.walk(tree)
        if isinstance(node, ast.keyword) and node.arg == "storage_path"
        and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
    ]


def storage_problem(uri: str, python: str | None = None) -> str | None:
    """Why Ray Train could not write to ``uri`` from ``python`` (default: this interpreter), or ``None``.

    >>> storage_problem("/mnt/shared/ray_results") is None
    True
    >>> storage_problem("hdfs://namenode/runs")
    "storage_path 'hdfs://namenode/runs': scheme 'hdfs' is not supported; accepted: a local or mounted path, file://, s3:// or gs:// (with pyarrow installed)"
    """
    scheme, sep, _ = uri.partition("://")
    if not sep or scheme == "file":
        return None
    modules = SCHEME_MODULES.get(scheme)
    if modules is None:
        return f"storage_path {uri!r}: scheme {scheme!r} is not supported; accepted: {ACCEPTED}"
    missing = _missing_modules(modules, python)
    if not missing:
        return None
    return (
        f"storage_path {uri!r} needs {', '.join(missing)}, which {'this Python' if python is None else python} "
        f"does not have: install pyarrow (pip install 'trainjob[ray]'), or use a local or mounted path"
    )


def _missing_modules(modules: tuple[str, ...], python: str | None) -> list[str]:
    if python is None or python == sys.executable:
        missing = []
        for name in modules:
            try:
                found = find_spec(name) is not None
            except ImportError:  # the parent package is missing
                found = False
            if not found:
                missing.append(name)
        return missing
    probe = "import importlib.util as u, sys\nfor m in sys.argv[1:]:\n try: ok = u.find_spec(m) is not None\n except ImportError: ok = False\n ok or print(m)"
    done = subprocess.run([python, "-c", probe, *modules], capture_output=True, text=True, timeout=60)
    return done.stdout.split()


def driver_script(driver: list[str]) -> Path | None:
    """The Python file a driver command runs (``python train.py``, ``torchrun train.py``, ``train.py``), if any."""
    for arg in driver[1:] if driver and not driver[0].endswith(".py") else driver:
        if arg.startswith("-"):
            if arg in ("-m", "-c"):
                return None
            continue
        return Path(arg) if arg.endswith(".py") else None
    return None
