"""Ray clusters inside a TrainJob, for the ``ray-distributed`` runtime (:mod:`trainjob.runtime.plugins.ray`).

Every node runs :mod:`trainjob.ray.node`: node 0 starts the Ray head and then the user's driver script, the other
nodes join the head with their CPUs and GPUs; Ray Train's ``train.report`` reaches the job's progress through
:mod:`trainjob.ray.reporting`. Nothing here is imported by a training script: Ray (``pip install trainjob[ray]``)
is only needed where a Ray job runs.
"""

from __future__ import annotations

#: The env var naming the file the reporting callback appends Ray Train's reports to (node 0 reads it).
REPORTS_FILE_ENV = "TRAINJOB_RAY_REPORTS_FILE"
#: The Ray Train callback the driver loads (Ray's ``RAY_TRAIN_CALLBACKS``), by import path.
REPORTING_CALLBACK = "trainjob.ray.reporting.TrainjobReportCallback"
