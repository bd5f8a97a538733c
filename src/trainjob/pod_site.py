"""The stall watch's hook in the training processes of a Kubernetes pod, for images with trainjob installed.

On the local backend every process of a node loads trainjob's ``sitecustomize``
(:mod:`trainjob.backends.local.worker_site`); a pod's processes start from its image alone. An image with trainjob
gets the same hook from a ``.pth`` file in its ``site-packages``, which Python reads at every start::

    RUN python -m trainjob.pod_site        # in the image's Dockerfile (deploy/training.Dockerfile does it)

The file holds one line that imports this module only where the operator asked for it
(``TRAINJOB_COLLECTIVES_URL`` set in the pod): any other Python process of the image pays one look at its
environment. Here, a training process (``LOCAL_RANK`` set by torchrun) then tells the operator, every few seconds
once its first collective ran, when its collectives last completed and how long one has been waiting (torch's
flight recorder sees DDP's collectives issued from C++ too), and writes its stacks to its log when they stop: what
the operator's stall watch needs for a script that never calls ``trainjob.torch.report``
(:func:`trainjob.backends.local.worker_site.sitecustomize.pod_main`).

Images without trainjob, or without the line, get the stall watch of scripts that report, and
``trainjob stacks NAME --debug-image`` (:mod:`trainjob.backends.kubernetes.pod_stacks`).
"""

from __future__ import annotations

import os
import sys

#: The file ``python -m trainjob.pod_site`` writes into ``site-packages``.
PTH_NAME = "trainjob-site.pth"
#: Its one line: the import runs only in a pod whose operator asked for collectives (nothing else is loaded).
PTH_LINE = 'import os; os.environ.get("TRAINJOB_COLLECTIVES_URL") and __import__("trainjob.pod_site")\n'
_LOADED = "trainjob_worker_site"


def _load() -> None:
    """Run ``pod_main`` of the local backend's ``sitecustomize`` (the file loaded under a name of its own, so
    that Python's own ``sitecustomize`` import, which follows the ``.pth`` files, is not taken)."""
    if _LOADED in sys.modules or "LOCAL_RANK" not in os.environ:
        return
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "backends", "local", "worker_site",
                        "sitecustomize.py")
    spec = importlib.util.spec_from_file_location(_LOADED, path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules[_LOADED] = module
    try:
        spec.loader.exec_module(module)
        module.pod_main()
    except Exception as exc:  # never stop a training process from starting
        sys.stderr.write(f"trainjob.pod_site: the stall watch's hook is off: {type(exc).__name__}: {exc}\n")


def install(site_packages: str | None = None) -> str:
    """Write :data:`PTH_NAME` into ``site_packages`` (this interpreter's ``purelib`` by default); its path."""
    import sysconfig

    directory = site_packages or sysconfig.get_paths()["purelib"]
    path = os.path.join(directory, PTH_NAME)
    with open(path, "w", encoding="utf-8") as f:
        f.write(PTH_LINE)
    return path


if __name__ == "__main__":
    print(f"trainjob.pod_site: wrote {install(sys.argv[1] if len(sys.argv) > 1 else None)}")
else:
    _load()
