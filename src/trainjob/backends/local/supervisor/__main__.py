"""Entry point of a job's supervisor process: ``python -m trainjob.backends.local.supervisor HOME NAME [--replace]``,
or ``--standby N`` (:mod:`.standby`): then the keepers of the job's N nodes are started before the supervisor is
imported (:mod:`.ahead`)."""

import sys

from trainjob.backends.local.supervisor.standby import keepers_ahead

ahead = keepers_ahead(sys.argv[1:])
if ahead:
    from trainjob.backends.local.supervisor.ahead import start_keepers_ahead

    start_keepers_ahead(ahead)

from trainjob.backends.local.supervisor.supervisor import main  # noqa: E402  (after the keepers' start)

sys.exit(main())
