"""CLI commands (module owned by its feature; registers into the top-level group)."""

from __future__ import annotations

import click


def register(group: click.Group) -> None:
    """Add this module's commands to the ``trainjob`` group."""
