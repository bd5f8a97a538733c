"""The remote-shell agent ``mpirun`` uses for local MPI jobs instead of ``ssh`` (``OMPI_MCA_plm_rsh_agent``).

``mpirun`` calls it as it would call ``ssh``: ``[options] HOST COMMAND...``. ``ssh`` options (``-o
ConnectionAttempts=10`` from ``OMPI_MCA_plm_rsh_args``, ``-x`` ...) are skipped; ``HOST`` is one of the job's
hosts (``TRAINJOB_MPI_HOSTS``), and the command goes to the node process that plays it
(:class:`trainjob.backends.local.mpi.hosts.HostServer`), which runs it there, as that host's ``sshd`` would. The agent
waits and exits with the command's exit code, or 255 (what ``ssh`` exits with) when the host is unknown or does
not answer. Killing the agent stops the command, as closing an ``ssh`` session would.

    python -m trainjob.backends.local.mpi.rsh -o ConnectionAttempts=10 mnist-node-0-1.mnist orted ...
"""

from __future__ import annotations

import json
import os
import sys

from trainjob.backends.local.mpi.hosts import HOSTS_ENV, request
from trainjob.constants import JOB_DIR_ENV

#: ssh options that take a value (``-o Key=Value``, ``-p 22`` ...); any other option is a flag.
_OPTIONS_WITH_VALUE = set("BbcDEeFIiJLlmOoPpQRSWw")
#: What ssh exits with when it cannot connect.
SSH_FAILED = 255


def split_ssh_args(args: list[str]) -> tuple[str, list[str]]:
    """``(host, command words)`` of an ssh command line, its options skipped.

    >>> split_ssh_args(["-o", "ConnectionAttempts=10", "-x", "h1", "orted", "-mca", "x", "1"])
    ('h1', ['orted', '-mca', 'x', '1'])
    """
    index = 0
    while index < len(args) and args[index].startswith("-") and args[index] != "--":
        option = args[index]
        takes_value = len(option) == 2 and option[1] in _OPTIONS_WITH_VALUE
        index += 2 if takes_value else 1
    if index < len(args) and args[index] == "--":
        index += 1
    if index >= len(args):
        raise ValueError(f"no host in {args!r}")
    return args[index], args[index + 1 :]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    hosts = json.loads(os.environ.get(HOSTS_ENV, "[]"))
    try:
        host, words = split_ssh_args(args)
    except ValueError as exc:
        print(f"trainjob rsh agent: {exc}", file=sys.stderr)
        return SSH_FAILED
    if host not in hosts:
        print(f"trainjob rsh agent: unknown host {host!r}; this job's hosts: {', '.join(hosts)}", file=sys.stderr)
        return SSH_FAILED
    try:
        answer = request(os.environ[JOB_DIR_ENV], hosts.index(host), {"op": "run", "command": " ".join(words)})
    except (OSError, ValueError, ConnectionError) as exc:
        print(f"trainjob rsh agent: host {host} did not run the command: {exc}", file=sys.stderr)
        return SSH_FAILED
    return int(answer.get("code", SSH_FAILED))


if __name__ == "__main__":
    sys.exit(main())
