"""Events a backend records when a job is submitted: where the job came from and what in its set-up looks wrong.

=====================  ========  ====================================================================
reason                 type      when
=====================  ========  ====================================================================
``Converted``          Normal    the TrainJob was converted from a kubeflow.org/v1 PyTorchJob
``ConversionWarning``  Warning   one per field the conversion could not carry over
``NcclSetup``          Warning   one per NCCL finding (:func:`trainjob.runtime.nccl.nccl_findings`)
=====================  ========  ====================================================================

>>> from trainjob.runtime import builtin_runtimes, resolve                         # doctest: +SKIP
>>> submit_events(job, resolve(job, builtin_runtimes()["torch-distributed"]))     # doctest: +SKIP
[SubmitEvent(reason='NcclSetup', message='TJ015 ...', type='Warning')]
"""

from __future__ import annotations

from dataclasses import dataclass

from trainjob.api import TrainJob
from trainjob.api.annotations import conversion_warnings, converted_from
from trainjob.runtime.nccl import nccl_findings
from trainjob.runtime.plan import Plan


@dataclass(frozen=True)
class SubmitEvent:
    reason: str
    message: str
    type: str = "Normal"


def submit_events(trainjob: TrainJob, plan: Plan) -> list[SubmitEvent]:
    """The events for submitting ``trainjob`` resolved into ``plan`` (table in the module docstring)."""
    annotations = trainjob.metadata.annotations
    events = []
    origin = converted_from(annotations)
    if origin:
        events.append(SubmitEvent("Converted", f"converted from {origin} {trainjob.name}"))
    events += [SubmitEvent("ConversionWarning", warning, "Warning") for warning in conversion_warnings(annotations)]
    events += [
        SubmitEvent("NcclSetup", f"{f.rule} {f.name}: {f.message}; fix: {f.fix}", "Warning")
        for f in nccl_findings(plan)
    ]
    return events
