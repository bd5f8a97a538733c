"""MPI jobs on the local backend: OpenMPI's ``mpirun`` on the launcher starts every host's ranks in that host's
node process (through trainjob's rsh agent), the job completes when the launcher does, and a failing rank fails
the job naming it.

The end-to-end tests need OpenMPI (Debian's ``openmpi-bin``); they are skipped without ``mpirun`` unless
``TRAINJOB_REQUIRE_MPI`` is set, as CI does."""

from __future__ import annotations

import io
import json
import os
import shutil
import time

import pytest
from jobtest.local import processes_under, trainjob_resource, wait_until

from trainjob.backends.local.mpi.output import RankLines, failure_report
from trainjob.backends.local.mpi.rsh import split_ssh_args
from trainjob.errors import JobFailedError

needs_mpirun = pytest.mark.skipif(
    shutil.which("mpirun") is None and not os.environ.get("TRAINJOB_REQUIRE_MPI"),
    reason="mpirun not found (Debian: apt-get install openmpi-bin); set TRAINJOB_REQUIRE_MPI=1 to fail instead",
)

ALL_REDUCE = """
    import json, os, tempfile
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["OMPI_COMM_WORLD_RANK"]), int(os.environ["OMPI_COMM_WORLD_SIZE"])
    address = f"tcp://{os.environ['PET_MASTER_ADDR']}:{os.environ['PET_MASTER_PORT']}"
    dist.init_process_group("gloo", init_method=address, rank=rank, world_size=world)
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    print(f"rank {rank} of {world}: sum {total.item():g}", flush=True)
    seen = {"world": world, "sum": total.item(), "node": os.environ["TRAINJOB_MPI_NODE"],
            "local_rank": os.environ["OMPI_COMM_WORLD_LOCAL_RANK"], "greeting": os.environ.get("GREETING"),
            "tmp": tempfile.gettempdir()}
    with open(os.path.join(os.environ["TRAINJOB_JOB_DIR"], f"rank-{rank}.json"), "w") as f:
        json.dump(seen, f)
    dist.destroy_process_group()
"""


@needs_mpirun
def test_an_mpi_job_runs_its_ranks_on_their_nodes_and_completes(backend, script):
    program = script("all_reduce.py", ALL_REDUCE)
    job = trainjob_resource("allreduce", ["mpirun", "python", program], runtime="mpi-distributed", num_nodes=2,
                            num_proc_per_node=2, env=[{"name": "GREETING", "value": "hi"}])
    backend.apply(job)

    assert backend.wait_for_job_status("allreduce", timeout=180).status == "Complete"
    job_dir = backend.store.job_dir("allreduce")
    seen = [json.loads((job_dir / f"rank-{rank}.json").read_text()) for rank in range(4)]
    assert [s["world"] for s in seen] == [4, 4, 4, 4]
    assert [s["sum"] for s in seen] == [10.0, 10.0, 10.0, 10.0]  # 1 + 2 + 3 + 4
    assert [(s["node"], s["local_rank"]) for s in seen] == [("0", "0"), ("0", "1"), ("1", "0"), ("1", "1")]
    assert {s["greeting"] for s in seen} == {"hi"}
    # a /tmp per host, as each pod has one: OpenMPI's daemons of one job race for a shared one's session folder
    assert [s["tmp"] for s in seen] == [str(job_dir / "mpi" / f"tmp-node-{node}") for node in (0, 0, 1, 1)]
    assert (job_dir / "mpi" / "hostfile").read_text() == "allreduce-node-0-0.allreduce slots=2\n" \
                                                         "allreduce-node-0-1.allreduce slots=2\n"
    for node, ranks in ((0, (0, 1)), (1, (2, 3))):  # each rank's output is in its own node's log
        lines = {(line.rank, line.text) for line in backend.logs("allreduce", node=node)}
        assert {(rank, f"rank {rank} of 4: sum 10") for rank in ranks} <= lines
    assert [line.text for line in backend.logs("allreduce", rank=3)] == ["rank 3 of 4: sum 10"]
    assert [s.status for s in backend.get_job("allreduce").steps] == ["Succeeded", "Succeeded"]
    reasons = [e.reason for e in backend.get_job_events("allreduce")]
    assert "MPIHosts" in reasons and "LauncherSharesNode" in reasons


@needs_mpirun
def test_a_failing_rank_fails_the_job_naming_the_rank_and_its_error(backend, script, trainjob_home):
    failing = script("fail.py", """
        import os, time
        if os.environ["OMPI_COMM_WORLD_RANK"] == "3":
            raise ValueError("boom on rank 3")
        time.sleep(60)
    """)
    started = time.monotonic()
    backend.apply(trainjob_resource("fails", ["mpirun", "python", failing], runtime="deepspeed-distributed",
                                    num_nodes=2, num_proc_per_node=2))

    with pytest.raises(JobFailedError, match=r"NodeFailed: node-0 rank 3: ValueError: boom on rank 3$"):
        backend.wait_for_job_status("fails", timeout=180)

    assert time.monotonic() - started < 50, "the other ranks sleep 60 s; the failure must end the job first"
    assert [line.text for line in backend.logs("fails", rank=3)][-1] == "ValueError: boom on rank 3"
    wait_until(lambda: processes_under(trainjob_home) == [], timeout=15)


def test_tagged_output_becomes_whole_lines_per_rank_even_when_tags_split_lines_and_reads():
    out, lines = io.StringIO(), []
    untag = RankLines(out.write, lambda rank, text: lines.append((rank, text)))
    stream = "[1,1]<stdout>:1[1,0]<stdout>:zero\n[1,1]<stdout>: of 4[1,1]<stdout>:\nmpirun: bye\n[1,2]<stderr>:tail"
    for cut in range(0, len(stream), 5):  # reads may cut anywhere, tags included
        untag.feed(stream[cut : cut + 5])
    untag.close()
    assert lines == [(0, "zero"), (1, "1 of 4"), (2, "tail")]
    assert out.getvalue() == untag.launcher_text == "mpirun: bye\n"


def test_the_failure_report_names_the_first_rank_mpirun_saw_fail(tmp_path):
    (tmp_path / "logs").mkdir()
    text = ("The first process to do so was:\n\n  Process name: [[17871,1],3]\n  Exit code:    7\n")
    report = failure_report(text, ["j-node-0-0.j", "j-node-0-1.j"], 2, 7, {3: "KeyError: 'x'"}, tmp_path)
    assert "  host      : j-node-0-1.j\n  rank      : 3 (local_rank: 1)\n  exitcode  : 7\n" in report
    error_file = tmp_path / "logs" / "mpi-rank-3.error.json"
    assert f"  error_file: {error_file}\n" in report
    assert json.loads(error_file.read_text()) == {"message": {"message": "KeyError: 'x'"}}
    assert failure_report("mpirun: no such file\n", ["h"], 1, 1, {}, tmp_path) is None


def test_when_mpirun_names_no_rank_the_first_rank_that_printed_an_exception_is_named(tmp_path):
    (tmp_path / "logs").mkdir()
    text = ("Primary job  terminated normally, but 1 process returned\na non-zero exit code. Per user-direction, "
            "the job has been aborted.\n")  # and nothing more, now and then
    report = failure_report(text, ["j-node-0-0.j", "j-node-0-1.j"], 2, 1,
                            {3: "ValueError: boom on rank 3", 0: "RuntimeError: peer closed"}, tmp_path)
    assert "  host      : j-node-0-1.j\n  rank      : 3 (local_rank: 1)\n  exitcode  : 1\n" in report
    assert json.loads((tmp_path / "logs" / "mpi-rank-3.error.json").read_text()) == {
        "message": {"message": "ValueError: boom on rank 3"}}


@pytest.mark.parametrize(
    ("argv", "host", "words"),
    [
        (["-o", "ConnectionAttempts=10", "h-node-0-1.h", "orted", "-mca", "a", "b"], "h-node-0-1.h",
         ["orted", "-mca", "a", "b"]),
        (["-x", "-p", "2222", "--", "h", "echo"], "h", ["echo"]),
    ],
)
def test_the_rsh_agent_reads_ssh_command_lines(argv, host, words):
    assert split_ssh_args(argv) == (host, words)
