"""Tools around a training run: size its memory and communication, check its script, measure collectives.

* :mod:`trainjob.tools.sizing`: ``estimate_memory`` / ``estimate_communication`` for a
  :class:`~trainjob.tools.training_setup.TrainingSetup` (``trainjob plan``), and ``search_layouts``, the layout search
  (``trainjob plan --auto``), printed by :mod:`trainjob.tools.sizing.report`;
* :mod:`trainjob.tools.checker`: ``check_file`` finds the classic distributed-training mistakes
  (``trainjob check``), with the rules in :mod:`trainjob.tools.check_rules` and what they look at (the parsed
  script) in :mod:`trainjob.tools.script`;
* :mod:`trainjob.tools.collectives`: nccl-tests-style benchmarks over real process groups
  (``trainjob bench collectives``), with the cost model and bus-bandwidth factors in :mod:`trainjob.tools.comm`.
"""
