"""Time to first render of the dashboard's job list over a store of 10,000 jobs, against reading that store.

``trainjob ui`` serves the store; headless Chromium (Debian's ``chromium``, driven by Playwright) opens ``/``
and the page records when its table first shows jobs (``window.tjFirstRender``, milliseconds since navigation
started: HTML, scripts, the ``/api/jobs`` answer and the rendering). Both a cold load (a fresh browser context,
nothing cached) and a warm one (the same context again) are measured, median of ``--runs``. Baselines, in the
same run over the same store: ``trainjob list`` as a user runs it (process start included) and the plain store
read behind it (``Store.list_summaries()`` in this process). Also reported: one ``/api/jobs`` answer alone::

    python benchmarks/ui_joblist.py --jobs 10000 --runs 7
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests" / "harness")]
from browsertest import launch  # noqa: E402  (Debian's chromium, as the browser tests start it)
from launch import fill_store, time_command  # noqa: E402  (the store the list benchmark uses)


def start_dashboard(env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    trainjob = str(Path(sys.executable).with_name("trainjob"))
    process = subprocess.Popen([trainjob, "ui", "--port", "0"], env=env, stdout=subprocess.PIPE, text=True)
    line = process.stdout.readline()  # "trainjob dashboard on http://127.0.0.1:PORT/ ..."
    if "http://" not in line:
        process.kill()
        raise RuntimeError(f"trainjob ui did not start: {line!r}")
    return process, line.split(" on ", 1)[1].split()[0].rstrip("/")


def first_render_ms(context, url: str) -> float:
    page = context.new_page()
    page.goto(url + "/")
    page.wait_for_function("() => window.tjFirstRender != null", timeout=60_000)
    rows = page.evaluate("() => document.querySelectorAll('#jobs tbody tr').length")
    value = page.evaluate("() => window.tjFirstRender")
    page.close()
    assert rows > 0, "the list rendered no rows"
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    from trainjob.backends.local.store import Store

    with tempfile.TemporaryDirectory(prefix="trainjob-bench-ui-") as tmp:
        home = Path(tmp) / "home"
        fill_store(home, args.jobs)
        env = {**os.environ, "TRAINJOB_HOME": str(home)}
        store = Store.open(home)
        store_read = []
        for _ in range(args.runs):
            started = time.perf_counter()
            assert len(store.list_summaries()) == args.jobs
            store_read.append(time.perf_counter() - started)
        trainjob = str(Path(sys.executable).with_name("trainjob"))
        list_command = [time_command([trainjob, "list"], env, Path(tmp)) for _ in range(args.runs)]
        server, url = start_dashboard(env)
        try:
            api = []
            for _ in range(args.runs):
                started = time.perf_counter()
                with urllib.request.urlopen(url + "/api/jobs", timeout=60) as response:
                    body = json.loads(response.read())
                api.append(time.perf_counter() - started)
            assert body["total"] == args.jobs
            with sync_playwright() as playwright:
                browser = launch(playwright)
                cold, warm = [], []
                for _ in range(args.runs):
                    context = browser.new_context()
                    cold.append(first_render_ms(context, url) / 1000)
                    warm.append(first_render_ms(context, url) / 1000)
                    context.close()
                browser.close()
        finally:
            server.terminate()
            server.wait(10)
    medians = {
        "first_render_cold_s": statistics.median(cold),
        "first_render_warm_s": statistics.median(warm),
        "api_jobs_s": statistics.median(api),
        "trainjob_list_command_s": statistics.median(list_command),
        "store_read_s": statistics.median(store_read),
    }
    result = {
        "jobs": args.jobs,
        "runs": args.runs,
        **{key: round(value, 4) for key, value in medians.items()},
        "ratio_cold_render_vs_trainjob_list": round(medians["first_render_cold_s"] / medians["trainjob_list_command_s"], 2),
        "ratio_warm_render_vs_trainjob_list": round(medians["first_render_warm_s"] / medians["trainjob_list_command_s"], 2),
        "ratio_warm_render_vs_store_read": round(medians["first_render_warm_s"] / medians["store_read_s"], 1),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
