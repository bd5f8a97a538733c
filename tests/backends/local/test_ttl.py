"""ttlSecondsAfterFinished (the ``trainjob/ttl-seconds-after-finished`` annotation) on the local backend."""

from __future__ import annotations

import pytest
from jobtest.local import trainjob_resource

from trainjob.backends.ttl import TTL_ANNOTATION
from trainjob.cli.main import main
from trainjob.errors import NotFoundError, ValidationError


def quick_job(name, script, ttl=None):
    resource = trainjob_resource(name, ["python", script])
    if ttl is not None:
        resource.metadata.annotations = {TTL_ANNOTATION: str(ttl)}
    return resource


def test_finished_jobs_past_their_ttl_are_removed_with_their_logs(backend, script):
    quick = script("quick.py", "print('done')\n")
    backend.apply(quick_job("expires", quick, ttl=0))
    backend.apply(quick_job("stays", quick, ttl=3600))
    backend.apply(quick_job("forever", quick))
    for name in ("expires", "stays", "forever"):
        assert backend.wait_for_job_status(name, timeout=60).status == "Complete"  # waiting still sees it finish
    log_dir = backend.store.job_dir("expires") / "logs"
    assert log_dir.exists()

    assert sorted(job.name for job in backend.list_jobs()) == ["forever", "stays"]

    assert not log_dir.exists()
    with pytest.raises(NotFoundError):
        backend.get_job("expires")
    assert backend.store.metrics("expires") == [] and backend.store.events("expires") == []


def test_gc_removes_expired_jobs_on_demand(backend, script, capsys):
    quick = script("quick.py", "print('done')\n")
    backend.apply(quick_job("short", quick, ttl=60))
    backend.wait_for_job_status("short", timeout=60)

    assert main(["gc"]) == 0
    assert "nothing to remove" in capsys.readouterr().out
    finished = backend.store.get_job("short")["finished"]
    backend.store.update_job("short", finished=finished - 61)  # as if a minute had passed
    assert main(["gc", "--dry-run"]) == 0
    assert capsys.readouterr().out.strip() == "trainjob/short expired (would be removed)"
    assert main(["gc"]) == 0
    assert capsys.readouterr().out.strip() == "trainjob/short removed"
    assert backend.store.list_jobs() == []


def test_a_ttl_that_is_not_a_number_of_seconds_is_refused(backend, script):
    quick = script("quick.py", "print('done')\n")
    with pytest.raises(ValidationError, match=r"metadata.annotations\[trainjob/ttl-seconds-after-finished\]: must be a whole"):
        backend.apply(quick_job("bad", quick, ttl="1h"))
