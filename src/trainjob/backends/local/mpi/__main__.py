"""Entry point of a local MPI job's node processes: ``python -m trainjob.backends.local.mpi node | launcher ...``."""

import sys

from trainjob.backends.local.mpi.hosts import main

sys.exit(main())
