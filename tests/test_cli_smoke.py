from trainjob.cli.main import main


def test_version_prints_and_exits_zero(capsys):
    assert main(["--version"]) == 0
    assert "trainjob" in capsys.readouterr().out
