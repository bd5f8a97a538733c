"""Entry point of a node's keeper process: ``python -m trainjob.backends.local.node_keeper [--ahead]``, its spec on
stdin. A keeper started ahead starts its node's launcher before it imports the keeper (:mod:`.launcher`)."""

import sys

from trainjob.backends.local.node_keeper.launcher import AHEAD_FLAG, Launcher

launcher = Launcher.start(sys.stdin.buffer.readline()) if sys.argv[1:2] == [AHEAD_FLAG] else None

from trainjob.backends.local.node_keeper.keeper import main  # noqa: E402  (after the launcher's start)

sys.exit(main(launcher))
