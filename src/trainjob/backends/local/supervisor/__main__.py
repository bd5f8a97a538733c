"""Entry point of a job's supervisor process: ``python -m trainjob.backends.local.supervisor HOME NAME [--replace]``."""

import sys

from trainjob.backends.local.supervisor.supervisor import main

sys.exit(main())
