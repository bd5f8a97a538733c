"""trainjob's config file: where it is and what it may say, read by the CLI and by the local backend alike.

The file is the first of ``$TRAINJOB_CONFIG``, ``$TRAINJOB_HOME/config.yaml`` and
``${XDG_CONFIG_HOME:-~/.config}/trainjob/config.yaml`` that exists. Every key is optional:

=====================  ==========================  ==============================================================
key                    value                       what reads it
=====================  ==========================  ==============================================================
``backend``            ``local`` or ``kubernetes``  every command (:mod:`trainjob.cli.plumbing`)
``namespace``          a string                    Kubernetes commands
``kubeconfig``         a path                      Kubernetes commands
``context``            a string                    Kubernetes commands
``strict_resources``   ``true`` or ``false``       the local queue: refuse a job bigger than this machine instead
                                                   of running it scaled down (:mod:`~trainjob.backends.local.queue`)
``priority_classes``   ``{name: integer}``         the local queue: what ``kueue.x-k8s.io/priority-class`` names
                                                   mean here (Kueue's WorkloadPriorityClass values)
=====================  ==========================  ==============================================================

::

    backend: local
    strict_resources: false
    priority_classes: {high: 1000, low: -10}

A key the file does not know, or a value of the wrong kind, is a :class:`~trainjob.errors.ValidationError` naming
the file and the key.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainjob.errors import ValidationError

CONFIG_ENV = "TRAINJOB_CONFIG"
#: Where the local backend keeps its jobs (its store and one folder per job), and where the config file is looked
#: for second.
HOME_ENV = "TRAINJOB_HOME"


def default_home() -> Path:
    """``$TRAINJOB_HOME``, else ``~/.trainjob``."""
    return Path(os.environ.get(HOME_ENV) or Path.home() / ".trainjob").expanduser()


def _string(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _boolean(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def _priority_classes(value: Any) -> dict[str, int] | None:
    if not isinstance(value, dict):
        return None
    if not all(isinstance(k, str) and k and isinstance(v, int) and not isinstance(v, bool) for k, v in value.items()):
        return None
    return dict(value)


#: Each key, the check of its value (``None``: wrong kind) and what it must be, for the error.
CONFIG_KEYS: dict[str, tuple[Callable[[Any], Any], str]] = {
    "backend": (_string, "a non-empty string"),
    "namespace": (_string, "a non-empty string"),
    "kubeconfig": (_string, "a non-empty string"),
    "context": (_string, "a non-empty string"),
    "strict_resources": (_boolean, "true or false"),
    "priority_classes": (_priority_classes, "a mapping of WorkloadPriorityClass names to integers ({high: 1000})"),
}


def config_paths() -> list[Path]:
    """Where the config file is looked for, first match wins."""
    paths = [Path(os.environ[CONFIG_ENV]).expanduser()] if os.environ.get(CONFIG_ENV) else []
    xdg = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config").expanduser()
    return [*paths, default_home() / "config.yaml", xdg / "trainjob" / "config.yaml"]


def load_config() -> tuple[dict[str, Any], Path | None]:
    """The config file's settings and its path (``{}, None`` when there is none); ``ValidationError`` when bad."""
    explicit = os.environ.get(CONFIG_ENV)
    for path in config_paths():
        if not path.is_file():
            if explicit and path == Path(explicit).expanduser():
                raise ValidationError(CONFIG_ENV, f"no such file: {path}")
            continue
        import yaml  # only when there is a file to read: most commands start without one

        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ValidationError(str(path), f"cannot read the trainjob config file: {exc}") from None
        if not isinstance(data, dict):
            raise ValidationError(str(path), f"must be a mapping of {', '.join(CONFIG_KEYS)}")
        for key, value in data.items():
            if key not in CONFIG_KEYS:
                raise ValidationError(f"{path}: {key}", f"unknown setting; known: {', '.join(CONFIG_KEYS)}")
            check, expected = CONFIG_KEYS[key]
            if check(value) is None:
                raise ValidationError(f"{path}: {key}", f"must be {expected}, got {value!r}")
        return data, path
    return {}, None
