"""Entry point of a job's supervisor process: ``python -m trainjob.backends.local.supervisor HOME NAME [--replace]``,
or ``--warm N`` for a warm supervisor (:mod:`.warm`): then warm keepers for the job's N nodes are started before
the supervisor is imported (:mod:`.warm_keepers`)."""

import sys

from trainjob.backends.local.supervisor.warm import warm_keeper_count

warm_keepers = warm_keeper_count(sys.argv[1:])
if warm_keepers:
    from trainjob.backends.local.supervisor.warm_keepers import start_warm_keepers

    start_warm_keepers(warm_keepers)

from trainjob.backends.local.supervisor.supervisor import main  # noqa: E402  (after the keepers' start)

sys.exit(main())
