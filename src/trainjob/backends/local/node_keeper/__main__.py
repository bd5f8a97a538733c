"""Entry point of a node's keeper process: ``python -m trainjob.backends.local.node_keeper [--warm]``, its spec on
stdin. A warm keeper starts its node's warm torchrun before it imports the keeper (:mod:`.warm_node`)."""

import sys

from trainjob.backends.local.node_keeper.warm_node import WARM_KEEPER_FLAG, WarmNode

warm_node = WarmNode.start(sys.stdin.buffer.readline()) if sys.argv[1:2] == [WARM_KEEPER_FLAG] else None

from trainjob.backends.local.node_keeper.keeper import main  # noqa: E402  (after the warm torchrun's start)

sys.exit(main(warm_node))
