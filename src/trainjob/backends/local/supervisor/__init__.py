"""The supervisor process of one local job: ``python -m trainjob.backends.local.supervisor HOME NAME`` (or
``--warm``, a warm supervisor started before its job exists: :mod:`~trainjob.backends.local.supervisor.warm`).

:mod:`~trainjob.backends.local.supervisor.supervisor` owns the job from start to end; it starts a keeper per
node (:mod:`~trainjob.backends.local.supervisor.nodes`), installs the job's packages
(:mod:`~trainjob.backends.local.supervisor.environment`), names the root cause of a failure
(:mod:`~trainjob.backends.local.supervisor.failures`) and, for shrinkable elastic jobs, runs the rendezvous store
(:mod:`~trainjob.backends.local.supervisor.rendezvous`, a process of its own).
"""
