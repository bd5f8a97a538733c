"""Local MPI jobs: the node processes that play the hosts, and the ``ssh`` that ``mpirun`` uses to reach them.

- ``python -m trainjob.backends.local.mpi node | launcher COMMAND...``: a node process playing one host, or the
  launcher running ``mpirun`` (:mod:`~trainjob.backends.local.mpi.hosts`);
- ``python -m trainjob.backends.local.mpi.rsh``: the remote-shell agent ``mpirun`` runs instead of ``ssh``
  (:mod:`~trainjob.backends.local.mpi.rsh`);
- :mod:`~trainjob.backends.local.mpi.output`: what ``mpirun`` prints, as per-rank logs and a failure report.
"""
