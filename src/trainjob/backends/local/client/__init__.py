"""The local backend as the CLI and the SDK use it, in their own process: submit, queue, read, stop.

:class:`~trainjob.backends.local.client.backend.LocalBackend` writes a job to the store and starts its supervisor
(:mod:`trainjob.backends.local.supervisor`); everything else here turns the store's rows into the SDK's types.
"""
