"""``trainjob stacks NAME``: every running rank's Python stacks, and which ranks the others wait for.

Each rank dumps all its threads when asked (even one blocked in a collective: see
:mod:`trainjob.backends.local.stacks`; on Kubernetes the ranks are asked through their pods, see
:meth:`~trainjob.backends.kubernetes.backend.KubernetesBackend.get_job_stacks`); the command prints them rank by
rank, then one line from
:func:`~trainjob.backends.stacks.find_stuck_ranks`::

    $ trainjob stacks mnist
    --- rank 0 (node-0, pid 4242) ---
    Current thread 0x00007f... (most recent call first):
      File ".../torch/distributed/distributed_c10d.py", line 2810 in all_reduce
      ...
    --- rank 1 (node-1, pid 4250) ---
    ...
    rank 1 is not in the all_reduce that rank 0 waits in: rank 1 is in __getitem__ (train.py:21)

``--main-thread`` prints only the thread running the script. On Kubernetes, ``--debug-image IMAGE`` (or
``$TRAINJOB_STACKS_IMAGE``; an image with Python and py-spy, ``deploy/stacks.Dockerfile``) reads the stacks of any
script in any Python image, through an ephemeral container beside each pod's training container
(:mod:`~trainjob.backends.kubernetes.pod_stacks`).
"""

from __future__ import annotations

import click

from trainjob.cli.plumbing import Target, backend_option, handle_errors, make_backend
from trainjob.errors import ValidationError


@click.command("stacks")
@click.argument("name")
@click.option("--main-thread", is_flag=True, help="Only the thread running the training script, not every thread.")
@click.option("--debug-image", metavar="IMAGE", envvar="TRAINJOB_STACKS_IMAGE",
              help="Kubernetes: read the stacks with py-spy from this image, in an ephemeral container beside each "
                   "pod (any script, any Python image; env TRAINJOB_STACKS_IMAGE).")
@backend_option
@handle_errors
def stacks_command(name: str, main_thread: bool, debug_image: str | None, backend: Target) -> None:
    """Print the Python stacks of every rank of a running job, and the ranks the others wait for."""
    from trainjob.backends.stacks import find_stuck_ranks, format_stacks

    if debug_image and backend.backend != "kubernetes":
        raise ValidationError("--debug-image", "applies to Kubernetes jobs; local ranks answer for themselves "
                              "(every local node runs trainjob's sitecustomize)")
    options = {"debug_image": debug_image} if debug_image else {}
    stacks = make_backend(backend).get_job_stacks(name, **options)
    summary = find_stuck_ranks(stacks).summary  # from the whole dumps: the threads are told apart there
    if main_thread:
        for rank in stacks:
            if rank.text:
                rank.text = "".join(f'  File "{f.file}", line {f.line} in {f.function}\n' for f in rank.main_thread())
    click.echo(format_stacks(stacks))
    click.echo(summary)
