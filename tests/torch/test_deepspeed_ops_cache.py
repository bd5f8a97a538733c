"""The cache of DeepSpeed wheels with their CPU ops compiled in that ``scripts/test.sh`` builds ahead
(``jobtest.deepspeed_ops``): which other environments' wheels its clean-up keeps."""

from __future__ import annotations

import os
import time
from pathlib import Path

from jobtest import deepspeed_ops

DAY = 24 * 3600


def _build(base: Path, name: str, used_days_ago: float, finished: bool = True) -> Path:
    folder = base / name
    folder.mkdir(parents=True)
    when = time.time() - used_days_ago * DAY
    if finished:
        (folder / deepspeed_ops.READY).write_text("{}")
        os.utime(folder / deepspeed_ops.READY, (when, when))
    os.utime(folder, (when, when))
    return folder


def test_the_clean_up_keeps_the_two_builds_last_used_and_none_unused_for_two_weeks(tmp_path: Path):
    this = _build(tmp_path, "this", 0)
    _build(tmp_path, "yesterday", 1)
    _build(tmp_path, "under-way", 0, finished=False)  # another run's build, not finished yet
    _build(tmp_path, "three-days", 3)
    _build(tmp_path, "cut-short", 30, finished=False)
    _build(tmp_path, "old", 20)

    deepspeed_ops.clean_up(this)

    assert sorted(path.name for path in tmp_path.iterdir()) == ["this", "under-way", "yesterday"]


def test_the_clean_up_removes_builds_unused_for_two_weeks_even_when_few(tmp_path: Path):
    this = _build(tmp_path, "this", 0)
    _build(tmp_path, "old", 15)

    deepspeed_ops.clean_up(this)

    assert [path.name for path in tmp_path.iterdir()] == ["this"]


def test_the_clean_up_leaves_a_build_under_way_alone(tmp_path: Path):
    """Another run's build goes to a hidden staging folder until it is complete: never removed under it."""
    this = _build(tmp_path, "this", 0)
    for days in (1, 2, 3):
        _build(tmp_path, f"other-{days}", days)
    _build(tmp_path, ".this-staging", 30, finished=False)

    deepspeed_ops.clean_up(this)

    assert sorted(path.name for path in tmp_path.iterdir()) == [".this-staging", "other-1", "other-2", "this"]


RECORD = """torch/__init__.py,sha256=AAA,100
torch/include/ATen/ATen.h,sha256=BBB,200
../../../bin/torchrun,sha256={script},186
torch-2.13.0.dist-info/INSTALLER,sha256=CCC,4
"""


def test_the_key_is_the_same_for_the_same_torch_installed_in_another_venv():
    """torch's entry scripts name the .venv's interpreter, so their hashes differ from one .venv to the next; the
    files the ops are compiled against do not."""
    here, there = RECORD.format(script="one-venv"), RECORD.format(script="another-venv")
    assert deepspeed_ops.record_hash(here) == deepspeed_ops.record_hash(there)
    patched = here.replace("ATen.h,sha256=BBB", "ATen.h,sha256=XXX")
    assert deepspeed_ops.record_hash(patched) != deepspeed_ops.record_hash(here)
