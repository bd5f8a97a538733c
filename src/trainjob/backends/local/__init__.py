"""The local backend: a TrainJob as a tree of processes on this machine, one folder per process.

::

    CLI / SDK process                     client/        LocalBackend: submit, admit from the queue, read, stop
    └── supervisor, one per job           supervisor/    python -m trainjob.backends.local.supervisor HOME NAME
        │                                                (``trainjob run``'s: ... --standby, started before the
        │                                                job is read and handed the job when it is created)
        ├── rendezvous store (shrinkable              python -m trainjob.backends.local.supervisor.rendezvous
        │   elastic jobs only)                              JOB_DIR PORT
        └── node keeper, one per node     node_keeper/   python -m trainjob.backends.local.node_keeper (spec on stdin)
            └── the node's command: the pod's command, usually torchrun
                │   shrinkable elastic jobs: torchrun/   python -m trainjob.backends.local.torchrun.elastic_agent
                │   MPI jobs:                mpi/        python -m trainjob.backends.local.mpi node | launcher ...
                │                                        (mpirun's ssh: python -m trainjob.backends.local.mpi.rsh)
                └── ranks                 worker_site/   on every node process's PYTHONPATH: its sitecustomize
                                                         records a rank's exception for the job's status and
                                                         dumps the rank's stacks when signalled

Modules at this level are shared by several of these processes:

=======================  ===========================================================================================
:mod:`.store`            the jobs' state in SQLite, read and written by the CLI, the SDK and every supervisor
:mod:`.processes`        finding and stopping a job's processes; the supervisor lock
:mod:`.process_specs`    how each node becomes a process (command, environment, CPUs, GPUs, ports): worked out
                         at submit, stored with the job, carried out by the supervisor
:mod:`.node_env`         what a node process gets of the environment the job is created from (light enough for
                         the processes that start ahead of a job)
:mod:`.volumes`          the pod template's volumes as host paths: worked out at submit, mounted by the keepers
:mod:`.log_writer`       node logs as the keepers write them
:mod:`.log_reader`       node logs as the CLI, the SDK, the UI and the supervisor's failure report read them
:mod:`.stacks`           every running rank's Python stacks, read by ``trainjob stacks`` and by the supervisor's
                         stall watchdog (:mod:`.supervisor.watchdog`)
=======================  ===========================================================================================
"""
