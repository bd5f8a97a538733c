"""Built-in runtime plugins, one concern each: ``torch``, ``mpi`` and ``plainml`` (ML policy), ``coscheduling`` and
``volcano`` (gang scheduling), ``jobset`` (final pod templates and JobSet settings). See
:mod:`trainjob.runtime.framework` for the order they run in."""
