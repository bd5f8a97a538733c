"""``trainjob.options``: the options of ``TrainerClient.train(options=[...])``, as ``kubeflow.trainer.options``.

The public import path for :mod:`trainjob.sdk.options`, where the options are defined and documented::

    from trainjob.options import Labels, Name
"""

from trainjob.sdk import options as _defined_in
from trainjob.sdk.options import *  # noqa: F403  (every public option, as listed in its __all__)

__all__ = list(_defined_in.__all__)
