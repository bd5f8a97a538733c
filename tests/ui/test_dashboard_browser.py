"""The dashboard in a real browser (headless Chromium) against real jobs of the local backend."""

from __future__ import annotations

import os
import re
import textwrap

import pytest
from jobtest.local import processes_under, trainjob_resource, wait_until

from trainjob.errors import JobFailedError

CORES = len(os.sched_getaffinity(0))

#: Two nodes of DDP-style training (gloo process group) that report loss and throughput every 0.1 s.
TRAIN = textwrap.dedent("""
    import math, time
    import torch.distributed as dist
    from trainjob.torch.metrics import report
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for step in range(1, 3001):
        time.sleep(0.1)
        print(f"step {step} on rank {rank}", flush=True)
        report({"loss": 2.0 * math.exp(-step / 80) + 0.1, "samples_per_s": 800.0 + step % 7}, step=step, total_steps=3000)
    dist.destroy_process_group()
""")

#: A finished run's curve, written the way trainjob.torch.report writes it (no torch, so it is quick).
CURVE = textwrap.dedent("""
    import json, os, sys, time
    scale = float(sys.argv[1])
    with open(os.environ["TRAINJOB_METRICS_FILE"], "a") as f:
        for step in range(1, 21):
            f.write(json.dumps({"time": time.time(), "step": step, "total_steps": 20,
                                "metrics": {"loss": scale / step}}) + "\\n")
""")

FAILS = textwrap.dedent("""
    import os
    if os.environ["RANK"] == "0":
        raise ValueError("learning rate must be positive, got -0.1")
""")


def points(page, metric: str) -> int:
    return int(page.get_attribute(f"[data-metric={metric}]", "data-points"))


def test_a_training_job_live_in_the_browser_then_suspended_resumed_and_deleted_with_confirmation(
    backend, dashboard, page, screenshot, tmp_path, trainjob_home
):
    script = tmp_path / "train.py"
    script.write_text(TRAIN, encoding="utf-8")
    backend.apply(trainjob_resource("ddp-live", ["torchrun", str(script)], num_nodes=2, num_proc_per_node=1))

    # The list shows the real job, running, without a reload.
    page.goto(dashboard + "/")
    page.wait_for_selector('tr[data-name="ddp-live"] .badge[data-status="Running"]')
    assert page.inner_text('tr[data-name="ddp-live"] td:nth-child(4)') == "2x1"
    page.wait_for_function("""() => /\\d+% \\d+\\/3000/.test(document.querySelector('tr[data-name="ddp-live"] .progress').innerText)""")
    screenshot(page, "list")

    # Its page: the loss curve gains points while it trains.
    page.click('tr[data-name="ddp-live"] a')
    page.wait_for_url(re.compile(r"/jobs/ddp-live$"))
    page.wait_for_selector("[data-metric=loss]")
    seen = points(page, "loss")
    page.wait_for_function(f"() => +document.querySelector('[data-metric=loss]').dataset.points >= {seen + 10}")
    assert points(page, "samples_per_s") > 0
    assert page.inner_text("#status") == "Running"

    # Logs follow: node-1's lines keep arriving while the job runs.
    page.select_option("#log-node", "1")
    page.wait_for_function("() => /node-1\\/rank-1 \\| step \\d+ on rank 1/.test(document.getElementById('logs').innerText)")
    last = max(map(int, re.findall(r"step (\d+) on rank 1", page.inner_text("#logs"))))
    page.wait_for_function(f"() => [...document.getElementById('logs').innerText.matchAll(/step (\\d+) on rank 1/g)].some(m => +m[1] >= {last + 10})")
    assert "rank 0" not in page.inner_text("#logs")
    screenshot(page, "training")

    # Suspend asks first; cancelling leaves the job running.
    page.click("#suspend")
    page.wait_for_selector("dialog#confirm[open]")
    assert "Suspend ddp-live?" in page.inner_text("dialog#confirm")
    screenshot(page, "confirm-suspend", full_page=False)
    page.click("dialog#confirm button[value=cancel]")
    page.wait_for_selector("dialog#confirm", state="hidden")
    assert backend.get_job("ddp-live").status == "Running"

    # Confirming suspends it: its processes stop, the page says so and the log stream ends.
    page.click("#suspend")
    page.click("dialog#confirm button[value=ok]")
    page.wait_for_selector('#status .badge[data-status="Suspended"]')
    assert backend.get_job("ddp-live").status == "Suspended"
    wait_until(lambda: processes_under(trainjob_home) == [], timeout=30, what="the suspended job's processes to end")
    page.wait_for_function("() => document.getElementById('log-state').innerText.startsWith('end of log')")
    assert page.is_enabled("#resume") and not page.is_enabled("#suspend")
    screenshot(page, "suspended")

    # Resume, then delete (each asks): the job runs again, then it is gone and the page goes back to the list.
    page.click("#resume")
    page.click("dialog#confirm button[value=ok]")
    page.wait_for_selector('#status .badge[data-status="Running"]')
    page.click("#delete")
    assert "cannot be undone" in page.inner_text("dialog#confirm")
    page.click("dialog#confirm button[value=ok]")
    page.wait_for_url(dashboard + "/")
    page.wait_for_selector("#empty", state="visible")
    assert backend.list_jobs() == []


def test_runs_compared_failure_root_cause_and_queue_in_the_browser(backend, dashboard, page, screenshot, tmp_path):
    curve, fails, sleeper = tmp_path / "curve.py", tmp_path / "fails.py", tmp_path / "sleep.py"
    curve.write_text(CURVE, encoding="utf-8")
    fails.write_text(FAILS, encoding="utf-8")
    sleeper.write_text("import time\ntime.sleep(600)\n", encoding="utf-8")
    backend.apply(trainjob_resource("run-a", ["python", str(curve), "1"]))
    backend.apply(trainjob_resource("run-b", ["python", str(curve), "2"]))
    backend.apply(trainjob_resource("bad-lr", ["torchrun", str(fails)], num_nodes=1, num_proc_per_node=2))
    whole_machine = {"requests": {"cpu": str(CORES)}}
    backend.apply(trainjob_resource("holder", ["python", str(sleeper)], resources_per_node=whole_machine))
    backend.apply(trainjob_resource("waiter", ["python", str(sleeper)], resources_per_node=whole_machine))
    for name in ("run-a", "run-b"):
        backend.wait_for_job_status(name, timeout=60)

    # Filter the list, select two finished runs and overlay their curves.
    page.goto(dashboard + "/")
    page.wait_for_selector('tr[data-name="waiter"] .badge[data-status="Queued"]')
    page.fill("#q", "run-")
    page.wait_for_function("() => document.querySelectorAll('#jobs tbody tr').length === 2")
    page.check('tr[data-name="run-a"] input[type=checkbox]')
    page.check('tr[data-name="run-b"] input[type=checkbox]')
    page.click("#compare")
    page.wait_for_url(re.compile(r"/compare\?jobs=run-a,run-b$"))
    page.wait_for_function("() => +(document.querySelector('[data-metric=loss]') || {dataset: {}}).dataset.points === 40")
    traces = page.evaluate("() => document.querySelector('[data-metric=loss]').data.map(t => [t.name, t.y[0], t.x.length])")
    assert sorted(traces) == [["run-a", 1, 20], ["run-b", 2, 20]]
    screenshot(page, "compare")

    # A failed job shows its root cause: the node, the rank and the exception.
    with pytest.raises(JobFailedError):
        backend.wait_for_job_status("bad-lr", timeout=120)
    page.goto(dashboard + "/jobs/bad-lr")
    page.wait_for_selector("#failure:not([hidden])")
    assert page.text_content("#failure-title") == "Failed: NodeFailed"
    cause = page.inner_text("#failure-text")
    assert "node-0 rank 0" in cause and "ValueError: learning rate must be positive, got -0.1" in cause
    screenshot(page, "failed")

    # A queued job says what it waits for.
    page.goto(dashboard + "/jobs/waiter")
    page.wait_for_selector('#status .badge[data-status="Queued"]')
    assert f"waiting for {CORES} CPU(s) (0 of {CORES} free); held by holder" in page.inner_text("#failure")
    screenshot(page, "queued")
