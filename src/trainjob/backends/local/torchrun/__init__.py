"""What runs as a local node's ``torchrun`` when torch's own will not do.

:mod:`~trainjob.backends.local.torchrun.elastic_agent` is torchrun for the nodes of shrinkable elastic jobs:
``python -m trainjob.backends.local.torchrun.elastic_agent ARGS``.
"""
