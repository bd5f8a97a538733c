"""``benchmarks/compare.py``: two files of benchmark figures held against each other."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

COMPARE = Path(__file__).resolve().parents[1] / "benchmarks" / "compare.py"


@pytest.fixture(scope="module")
def compare():
    spec = importlib.util.spec_from_file_location("benchmark_compare", COMPARE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write(path: Path, data: dict) -> Path:
    path.write_text(json.dumps(data))
    return path


def test_figures_are_the_numbers_of_nested_objects_by_path_lists_and_booleans_left_out(compare):
    data = {"launch": {"ratio": 1.2, "runs": 9, "ok": True, "note": "x"}, "runs": [{"wall": 3.0}], "n": 0}

    assert compare.figures(data) == {"launch.ratio": 1.2, "launch.runs": 9.0, "n": 0.0}


def test_the_ratio_of_every_shared_figure_is_printed_in_the_first_files_order(compare, tmp_path, capsys):
    before = write(tmp_path / "before.json", {"list": {"list_command_s": 0.8, "jobs": 10000, "gone_s": 1.0}})
    after = write(tmp_path / "after.json", {"list": {"jobs": 10000, "list_command_s": 0.2, "new_s": 1.0}})

    assert compare.main([str(before), str(after)]) == 0

    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == ["figure", "list.list_command_s", "list.jobs"]
    assert lines[1].split()[1:] == ["0.8", "0.2", "0.25x"]
    assert lines[2].split()[-1] == "1.00x"


def test_max_ratio_fails_on_a_time_that_grew_more_and_ignores_other_figures(compare, tmp_path, capsys):
    before = write(tmp_path / "before.json", {"launch": {"trainjob_run_s": 2.0, "ratio": 1.0}})
    slower = write(tmp_path / "slower.json", {"launch": {"trainjob_run_s": 2.2, "ratio": 1.5}})

    assert compare.main([str(before), str(slower), "--max-ratio", "1.2"]) == 0, "a ratio is not a time"
    assert compare.main([str(before), str(slower), "--max-ratio", "1.05"]) == 1
    assert "launch.trainjob_run_s: 1.10x, more than 1.05x" in capsys.readouterr().err


def test_files_without_figures_in_common_are_an_error(compare, tmp_path, capsys):
    before = write(tmp_path / "before.json", {"a": 1})
    after = write(tmp_path / "after.json", {"b": 1})

    assert compare.main([str(before), str(after)]) == 2
    assert "no figures in common" in capsys.readouterr().err


def test_a_zero_figure_has_no_ratio(compare):
    assert compare.compare({"x": 0.0}, {"x": 1.0}) == [("x", 0.0, 1.0, None)]


def test_launch_benchmark_counts_the_cpu_of_processes_that_outlive_their_parents(subprocesses, tmp_path):
    """``benchmarks/launch.py`` adopts the processes a run leaves (a job's supervisor outlives its command) and
    counts their CPU time: here a child that starts a grandchild burning ~0.3 s of CPU and exits at once."""
    import sys

    burn = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass\n"
    parent = f"import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', {burn!r}], start_new_session=True)\n"
    probe = (
        "import subprocess, sys\n"
        f"sys.path.insert(0, {str(COMPARE.parent)!r})\n"
        "import launch\n"
        "launch.adopt_orphans()\n"
        f"subprocess.run([sys.executable, '-c', {parent!r}], check=True)\n"
        "print(launch.children_cpu())\n"
    )
    counted = float(subprocesses.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                                     cwd=tmp_path, timeout=60).stdout)
    assert counted >= 0.3, counted  # the orphaned grandchild's CPU time, not only its parent's
