"""A job's own Python environment for ``packages_to_install``, layered over this one so torch stays visible.

The job gets a virtual environment in its directory whose ``site-packages`` adds this interpreter's
site-packages (and their ``.pth`` files, so editable installs keep working) after its own: packages pip
installs there win, everything else resolves as before, and pip sees installed packages as satisfied::

    python = prepare_environment(job_dir / "venv", ["tqdm>=4"], ["https://pypi.org/simple"])
"""

from __future__ import annotations

import site
import subprocess
import sys
import sysconfig
from pathlib import Path

from trainjob.sdk.types import DEFAULT_PIP_INDEX_URLS

PIP_TIMEOUT_SECONDS = 900


class PackageInstallError(RuntimeError):
    """pip could not install the requested packages; the message is pip's own."""


def prepare_environment(venv: Path, packages: list[str], pip_index_urls: list[str] | None = None) -> str:
    """Create ``venv`` (once) with this interpreter's packages visible, pip-install ``packages``; its python."""
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True)
        purelib = Path(
            subprocess.run(
                [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                check=True, capture_output=True, text=True,
            ).stdout.strip()
        )
        parents = [p for p in dict.fromkeys([*site.getsitepackages(), sysconfig.get_paths()["purelib"]]) if Path(p).is_dir()]
        lines = [f"import site; site.addsitedir({p!r})" for p in parents]
        (purelib / "zz-trainjob-parent.pth").write_text("\n".join(lines) + "\n", encoding="utf-8")
    command = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "--no-input", *index_options(pip_index_urls), *packages]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        raise PackageInstallError(f"pip install {' '.join(packages)} took longer than {PIP_TIMEOUT_SECONDS} s") from None
    if result.returncode != 0:
        raise PackageInstallError(f"pip install {' '.join(packages)} failed: {pip_error(result.stderr or result.stdout)}")
    return str(python)


def index_options(pip_index_urls: list[str] | None) -> list[str]:
    """pip options for the index URLs; none for the default index, so a local pip configuration still applies."""
    urls = list(pip_index_urls or [])
    if not urls or urls == list(DEFAULT_PIP_INDEX_URLS):
        return []
    return ["--index-url", urls[0], *(option for url in urls[1:] for option in ("--extra-index-url", url))]


def pip_error(output: str) -> str:
    """pip's ``ERROR:`` lines, or its last line when there are none."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR:")]
    return " ".join(errors) if errors else (lines[-1] if lines else "no output")
