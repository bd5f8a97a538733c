"""Sizing a training run before it starts (``trainjob plan``): memory per GPU, communication per step, layouts.

=====================================  ===========================================================================
:mod:`~trainjob.tools.sizing.memory`         model states, activations and the pipeline bubble per GPU
                                             (:func:`~trainjob.tools.sizing.memory.estimate_memory`)
:mod:`~trainjob.tools.sizing.communication`  each collective of a step, its bytes and time
                                             (:func:`~trainjob.tools.sizing.communication.estimate_communication`)
:mod:`~trainjob.tools.sizing.layout_search`  ``--auto``: every layout that fits, ranked by estimated step time
                                             (:func:`~trainjob.tools.sizing.layout_search.search_layouts`)
:mod:`~trainjob.tools.sizing.deepspeed`      ``--ds-config``: the layout a DeepSpeed config describes
:mod:`~trainjob.tools.sizing.report`         the estimates as rich tables or JSON
=====================================  ===========================================================================

All of them take a :class:`~trainjob.tools.training_setup.TrainingSetup`.
"""
