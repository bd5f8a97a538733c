"""``trainjob cache list|prune``: the datasets and models initializers downloaded on this machine
(:mod:`trainjob.initializers.cache`, under ``$TRAINJOB_HOME/cache/data`` or ``$TRAINJOB_DATA_CACHE``)::

    $ trainjob cache list
    KEY           KIND     FILES  SIZE     LAST USED             SOURCE
    de1481640d86  dataset  2      41.8 kB  2026-12-07T21:11:05Z  hf://tatsu-lab/alpaca at 4ab6a75fcdf3
    $ trainjob cache prune --unused-for 7d        # or --all, or KEY ... (a key's first characters are enough)

A job's files are hard links to an entry's (copies across filesystems), so pruning an entry leaves the jobs that
use it their files; the next job of that source downloads it again.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict

import click

from trainjob.cli.plumbing import handle_errors
from trainjob.errors import ValidationError


def _cache():  # type: ignore[no-untyped-def]
    from trainjob.initializers.cache import DataCache, data_cache_dir
    from trainjob.settings import default_home

    folder = data_cache_dir(default_home(), os.environ)
    if folder is None:
        raise ValidationError("TRAINJOB_DATA_CACHE", "is 'off': there is no download cache on this machine")
    return DataCache(folder)


@click.group("cache")
def cache_command() -> None:
    """The download cache of dataset and model initializers on this machine."""


@cache_command.command("list")
@click.option("-o", "--output", type=click.Choice(["table", "json"]), default="table", show_default=True)
@handle_errors
def list_command(output: str) -> None:
    """List the cache's entries, most recently used first."""
    from trainjob.cli.timespec import rfc3339
    from trainjob.initializers.transfer import human_bytes

    entries = _cache().entries()
    if output == "json":
        click.echo(json.dumps([asdict(e) for e in entries], indent=1))
        return
    rows = [("KEY", "KIND", "FILES", "SIZE", "LAST USED", "SOURCE")]
    rows += [(e.key[:12], e.kind, str(e.files), human_bytes(e.bytes), rfc3339(e.last_used).split(".")[0] + "Z",
              f"{e.uri} at {e.version[:12]}") for e in entries]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())


@cache_command.command("prune")
@click.argument("keys", nargs=-1)
@click.option("--all", "everything", is_flag=True, help="Remove every entry.")
@click.option("--unused-for", metavar="DURATION", help="Remove entries no job used for this long (30m, 12h, 7d).")
@handle_errors
def prune_command(keys: tuple[str, ...], everything: bool, unused_for: str | None) -> None:
    """Remove entries: KEY ..., those unused for a while, or all. An entry a running initializer holds stays."""
    from trainjob.initializers.transfer import human_bytes
    from trainjob.units import duration_seconds

    chosen = sum(bool(x) for x in (keys, everything, unused_for))
    if chosen != 1:
        raise ValidationError("trainjob cache prune", "give exactly one of KEY ..., --all or --unused-for DURATION")
    older = None
    if unused_for is not None:
        text = unused_for.strip()
        older = float(text[:-1]) * 86400 if text[:-1].isdigit() and text.endswith("d") else duration_seconds(text)
        if older is None:
            raise ValidationError("--unused-for", f"must be a duration such as 30m, 12h or 7d, got {unused_for!r}")
    removed = _cache().prune(older_than_seconds=older, keys=list(keys) if keys else None)
    for entry in removed:
        click.echo(f"removed {entry.key[:12]} {entry.uri} ({human_bytes(entry.bytes)})")
    click.echo(f"removed {len(removed)} entr{'y' if len(removed) == 1 else 'ies'}, "
               f"{human_bytes(sum(e.bytes for e in removed))}")
