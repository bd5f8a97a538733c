"""Built-in runtime plugins, one concern each: ``torch``, ``mpi``, ``ray`` and ``plainml`` (ML policy), ``coscheduling`` and
``volcano`` (gang scheduling and their PodGroup), ``jobset`` (final pod templates and the JobSet). Each imports
only the plugin base (:mod:`trainjob.runtime.plugin`); :mod:`trainjob.runtime.registry` lists them in the order
they run, :mod:`trainjob.runtime.framework` runs them."""
