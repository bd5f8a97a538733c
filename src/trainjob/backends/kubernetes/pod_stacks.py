"""Stacks of the ranks of any Python image: py-spy in an ephemeral container beside the pod's training container.

``trainjob stacks NAME --debug-image IMAGE`` (or ``$TRAINJOB_STACKS_IMAGE``) adds to each running pod of the job an
ephemeral container of ``IMAGE`` (one with Python and ``py-spy`` on its ``PATH``: ``deploy/stacks.Dockerfile``), as
``kubectl debug --target`` does: it shares the training container's processes (``targetContainerName``) and has
``SYS_PTRACE``, finds every training process (``RANK`` and ``LOCAL_RANK`` in its environment), runs ``py-spy dump``
on each and prints the stacks in :mod:`faulthandler`'s format under the lines
:func:`~trainjob.log_stacks.stacks_in_log` reads (:data:`DUMPER`). The client reads them back from that container's
log. Nothing is needed of the training image but Python: no trainjob, no ``trainjob.torch`` call in the script.

Which pods get which (the docs say the same):

========================================  ===========================================================================
a script that calls ``trainjob.torch``    its ranks answer ``trainjob stacks NAME`` themselves, through the pod's
(``init``, ``report``), image with        downward-API volume (``KubernetesBackend.get_job_stacks``), and dump when
trainjob                                  they stop reporting
any other script, image with trainjob    ``--debug-image`` (this module); each rank dumps when its collectives
and ``trainjob-site.pth``                 stop (:mod:`trainjob.pod_site`), for the stall watch
any other Python image or script          ``trainjob stacks NAME --debug-image IMAGE``: this module
========================================  ===========================================================================

An ephemeral container cannot be removed from its pod (Kubernetes keeps them, exited, until the pod goes), so each
request adds one, named :data:`CONTAINER_PREFIX` and the request.
"""

from __future__ import annotations

from typing import Any

#: Ephemeral containers of ``trainjob stacks`` are named this and the request (``trainjob-stacks-1801...``).
CONTAINER_PREFIX = "trainjob-stacks-"
#: The environment variable naming the debug image ``trainjob stacks`` uses when ``--debug-image`` is not given.
STACKS_IMAGE_ENV = "TRAINJOB_STACKS_IMAGE"

#: What the ephemeral container runs (``python3 -c DUMPER REQUEST``): standard library only, any Python 3.
DUMPER = r'''
import os, re, subprocess, sys
request = sys.argv[1]
frame = re.compile(r"^\s+(?P<function>.*) \((?P<file>.*):(?P<line>\d+)\)$")
thread = re.compile(r"^Thread (?P<id>\d+|0x[0-9a-fA-F]+) \((?P<state>[^)]*)\)(?:: \"(?P<name>.*)\")?")
for entry in sorted((e for e in os.listdir("/proc") if e.isdigit()), key=int):
    try:
        with open("/proc/%s/environ" % entry, "rb") as f:
            env = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
    except OSError:
        continue
    if b"RANK" not in env or b"LOCAL_RANK" not in env:
        continue
    rank = env[b"RANK"].decode()
    prefix = "[trainjob-stacks rank %s] " % rank
    lines = ["stacks on request %s:" % request]
    try:
        done = subprocess.run(["py-spy", "dump", "--full-filenames", "--pid", entry], capture_output=True,
                              text=True, timeout=60)
        out = done.stdout if done.returncode == 0 else ""
        problem = (done.stderr or done.stdout).strip().splitlines()[-1:] if done.returncode else []
    except (OSError, subprocess.SubprocessError) as exc:
        out, problem = "", [str(exc)]
    first = True
    for text in out.splitlines():
        t, f = thread.match(text), frame.match(text)
        if t:  # the main thread (py-spy names it once the script imported threading; it lists it first)
            number = int(t["id"], 0)
            head = "Current thread" if t["name"] == "MainThread" or (first and not t["name"]) else "Thread"
            first = False
            lines.append("%s 0x%016x [%s] (most recent call first):" % (head, number, t["name"] or ""))
        elif f:
            lines.append('  File "%s", line %s in %s' % (f["file"], f["line"], f["function"]))
    if problem:
        lines.append("py-spy could not read pid %s: %s" % (entry, problem[0]))
    sys.stdout.write("".join(prefix + line + "\n" for line in lines))
    sys.stdout.flush()
'''


def ephemeral_container(request: str, image: str, target: str = "node") -> dict[str, Any]:
    """The ephemeral container that dumps the stacks of ``target``'s training processes for ``request``."""
    return {
        "name": f"{CONTAINER_PREFIX}{request}",
        "image": image,
        "targetContainerName": target,
        "command": ["python3", "-c", DUMPER, request],
        "securityContext": {"capabilities": {"add": ["SYS_PTRACE"]}},
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


def dumper_state(pod: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The state of ephemeral container ``name`` in ``pod``'s status (``{"terminated": ...}``), ``None`` before
    the kubelet reports it."""
    for status in (pod.get("status") or {}).get("ephemeralContainerStatuses") or []:
        if status.get("name") == name:
            return status.get("state") or {}
    return None
