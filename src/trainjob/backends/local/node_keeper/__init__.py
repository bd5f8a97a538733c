"""The keeper process of one node of a local job: ``python -m trainjob.backends.local.node_keeper``.

:mod:`~trainjob.backends.local.node_keeper.keeper` starts the node's command and stays its parent until
everything the node started has ended; :mod:`~trainjob.backends.local.node_keeper.mounts` gives the node its
private mount namespace.
"""
