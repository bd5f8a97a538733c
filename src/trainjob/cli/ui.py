"""``trainjob ui`` (the web dashboard) and ``trainjob gc`` (remove jobs past their TTL now).

::

    trainjob ui                          # http://127.0.0.1:8470, the local backend
    trainjob ui --port 0 --backend kubernetes
    trainjob gc --dry-run
"""

from __future__ import annotations

import time

import click

from trainjob.cli.plumbing import EXIT_FAILED, backend_option, fail, handle_errors, make_backend

DEFAULT_PORT = 8470


@click.command("ui")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on. The dashboard can stop and delete jobs: keep it on loopback.")
@click.option("--port", type=click.IntRange(0, 65535), default=DEFAULT_PORT, show_default=True,
              help="Port to listen on; 0 picks a free one.")
@click.option("--open", "open_browser", is_flag=True, help="Open the dashboard in a browser once it serves.")
@backend_option
@handle_errors
def ui_command(host: str, port: int, open_browser: bool, backend: str) -> None:
    """Serve the dashboard: jobs, curves, logs, events; suspend, resume and delete."""
    try:
        from trainjob.ui.server import serve
    except ImportError as exc:
        fail(f"the dashboard needs the ui extra: pip install 'trainjob[ui]' ({exc})", EXIT_FAILED)
    serve(make_backend(backend), host=host, port=port, open_browser=open_browser)


@click.command("gc")
@click.option("--dry-run", is_flag=True, help="Only print the jobs that would be removed.")
@backend_option
@handle_errors
def gc_command(dry_run: bool, backend: str) -> None:
    """Remove finished jobs past their trainjob/ttl-seconds-after-finished, with their logs."""
    client = make_backend(backend)
    names = client.expired_jobs(time.time())
    for name in names:
        if not dry_run:
            client.delete_job(name)
        click.echo(f"trainjob/{name} " + ("expired (would be removed)" if dry_run else "removed"))
    if not names:
        click.echo("nothing to remove")

