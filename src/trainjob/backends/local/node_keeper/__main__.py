"""Entry point of a node's keeper process: ``python -m trainjob.backends.local.node_keeper``, its spec on stdin."""

import sys

from trainjob.backends.local.node_keeper.keeper import main

sys.exit(main())
