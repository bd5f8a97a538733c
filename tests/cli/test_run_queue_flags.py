"""``trainjob run --priority/--oversubscribe/--strict-resources/--ttl-seconds-after-finished`` set the annotations
the queue and the TTL read, so a user need not write YAML for them."""

from __future__ import annotations

from pathlib import Path

import yaml


def test_run_flags_become_the_queue_and_ttl_annotations(local_jobs, cli, tmp_path: Path) -> None:
    script = tmp_path / "hello.py"
    script.write_text("print('hello')\n")
    code, out, err = cli("run", str(script), "--name", "flagged", "--priority", "7", "--oversubscribe",
                         "--strict-resources", "--ttl-seconds-after-finished", "3600", "-d")
    assert code == 0, err
    assert out.strip() == "flagged"
    code, out, err = cli("get", "flagged", "-o", "yaml")
    assert code == 0, err
    annotations = yaml.safe_load(out)["metadata"]["annotations"]
    assert annotations["trainjob/priority"] == "7"
    assert annotations["trainjob/oversubscribe"] == "true"
    assert annotations["trainjob/strict-resources"] == "true"
    assert annotations["trainjob/ttl-seconds-after-finished"] == "3600"


def test_run_flags_that_are_not_numbers_are_usage_errors(cli, tmp_path: Path) -> None:
    script = tmp_path / "hello.py"
    script.write_text("print('hello')\n")
    code, _, err = cli("run", str(script), "--priority", "high", "-d")
    assert code == 2 and "--priority" in err and "high" in err
    code, _, err = cli("run", str(script), "--ttl-seconds-after-finished", "-5", "-d")
    assert code == 2 and "--ttl-seconds-after-finished" in err
