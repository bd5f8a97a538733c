"""The stall watch's hook in a pod's training processes (:mod:`trainjob.pod_site`), run here as a pod would run it:
torchrun's ranks in an environment where ``trainjob-site.pth`` is read at start-up and the operator's variables
are set, reporting to a real HTTP endpoint on loopback. A plain gloo script (no trainjob call) whose rank 1 stops
in a ``time.sleep`` for a few seconds: the ranks report their collectives, rank 0's wait grows while none completes,
each rank writes its stacks to its output once, and all of it ends when rank 1 goes on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from trainjob.log_stacks import stacks_in_log
from trainjob.pod_site import PTH_LINE, install

SCRIPT = """
import time
import torch, torch.distributed as dist

dist.init_process_group("gloo")
for step in range(1, 31):
    if step == 10 and dist.get_rank() == 1:
        time.sleep(7)  # blocked, as a data loader reading from a stuck mount would be
    dist.all_reduce(torch.ones(4))
    time.sleep(0.05)
print(f"rank {dist.get_rank()} done", flush=True)
dist.destroy_process_group()
"""


class _Endpoint(BaseHTTPRequestHandler):
    reports: list[tuple[float, str, dict[str, Any]]] = []
    paths: list[str] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.reports.append((time.time(), self.headers.get("Authorization", ""), body))
        self.paths.append(self.path)
        answer = b'{"message": "accepted"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: Any) -> None:
        pass


def test_a_pods_ranks_report_their_collectives_and_dump_their_stacks_when_they_stop(
    tmp_path: Path, subprocesses: Any
) -> None:
    site, hook = tmp_path / "site-packages", tmp_path / "hook"
    site.mkdir()
    hook.mkdir()
    assert Path(install(str(site))).read_text() == PTH_LINE
    # the image's site-packages holds the .pth; here a sitecustomize adds the folder as a site dir, as Python
    # does with site-packages at start-up (the line is read the same way)
    (hook / "sitecustomize.py").write_text(f"import site\nsite.addsitedir({str(site)!r})\n")
    (tmp_path / "train.py").write_text(SCRIPT)
    (tmp_path / "token").write_text("projected-token\n")
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Endpoint)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(hook), "PYTHONUNBUFFERED": "1",
           # as the operator sets them: the collectives URL relative to the job's status URL
           "KUBEFLOW_TRAINER_SERVER_URL": f"http://127.0.0.1:{server.server_port}/trainjobs/mnist/status",
           "TRAINJOB_COLLECTIVES_URL": "collectives",
           "KUBEFLOW_TRAINER_SERVER_TOKEN": str(tmp_path / "token"), "TRAINJOB_STALL_DUMP": "2"}
    try:
        untouched = subprocesses.run([sys.executable, "-c", "import sys; print('trainjob.pod_site' in sys.modules)"],
                                     env={**env, "TRAINJOB_COLLECTIVES_URL": ""}, capture_output=True, text=True)
        assert untouched.stdout.strip() == "False", untouched.stderr  # no operator asked: nothing loaded
        torchrun = subprocesses.popen(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
             str(tmp_path / "train.py")],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
            start_new_session=True)
        try:
            output, _ = torchrun.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            os.killpg(torchrun.pid, signal.SIGKILL)  # its ranks with it
            output, _ = torchrun.communicate()
    finally:
        server.shutdown()
        server.server_close()
    assert torchrun.returncode == 0 and "rank 1 done" in output, output[-3000:]
    reports = _Endpoint.reports
    assert {body["rank"] for _, _, body in reports} == {0, 1}, reports
    assert {auth for _, auth, _ in reports} == {"Bearer projected-token"}
    assert set(_Endpoint.paths) == {"/trainjobs/mnist/collectives"}
    # rank 0 waited in its all_reduce while none completed: a report said so, with the wait grown past 2 s
    stalled = [body for _, _, body in reports if body["rank"] == 0 and (body["waitingFor"] or 0) > 2
               and (body["completedAgo"] or 0) > 2]
    assert stalled, reports
    # every rank wrote its stacks once: rank 1 in the sleep outside the collective, rank 0 in the all_reduce
    dumps = stacks_in_log(output)
    assert set(dumps) == {0, 1}, output[-3000:]
    assert 'train.py", line 8 in <module>' in dumps[1] and "all_reduce" in dumps[0], dumps
    assert output.count("[trainjob-stacks rank 1] no progress for") == 1
    # the reports came every second or so (a fifth of the dump time, at least a second), not at every collective
    rank_1 = [at for at, _, body in reports if body["rank"] == 1]
    assert len(rank_1) <= (rank_1[-1] - rank_1[0]) / 0.9 + 2, rank_1
