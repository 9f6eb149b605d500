"""The ``dynamix-gym`` console command (dynamix_gym/cli.py): a subcommand runs its Hydra app with
the rest of the command line as the app's own."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pandas as pd
import pytest
from support import ROOT, run_python

from dynamix_gym import cli


def test_every_subcommand_is_an_entry_point_of_experiments():
    for name, (module, _help) in cli.COMMANDS.items():
        assert module == f"experiments.{name}"
        assert (ROOT / "experiments" / f"{name}.py").is_file(), name
        assert (ROOT / "conf" / f"{name}.yaml").is_file(), name  # a Hydra app with its config


def test_every_app_is_a_subcommand():
    """The subcommands are found, not listed by hand: one per primary config (conf/<app>.yaml)."""
    assert set(cli.COMMANDS) == {p.stem for p in (ROOT / "conf").glob("*.yaml")}
    assert all(help_line for _module, help_line in cli.COMMANDS.values())


def test_a_subcommand_gets_the_rest_of_the_command_line(monkeypatch):
    ran = []
    monkeypatch.setattr(
        cli.runpy, "run_module", lambda module, **kw: ran.append((module, list(sys.argv), kw))
    )
    assert cli.main(["evaluate", "-m", "controller=dlb", "seed=0,1"]) == 0
    assert ran == [
        (
            "experiments.evaluate",
            ["dynamix-gym evaluate", "-m", "controller=dlb", "seed=0,1"],
            {"run_name": "__main__", "alter_sys": True},
        )
    ]
    assert sys.argv[0] != "dynamix-gym evaluate"  # put back


def test_help_and_unknown_commands(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in ("train", "evaluate", "benchmark", "deploy", "calibrate"))
    assert cli.main(["nope"]) == 2
    assert "unknown command 'nope'" in capsys.readouterr().err
    assert cli.main([]) == 2


@pytest.mark.integration
def test_dynamix_gym_evaluate_is_python_m_experiments_evaluate(tmp_path):
    """The same run, the same summary row (but the measured decision time)."""
    script = shutil.which("dynamix-gym", path=str(Path(sys.executable).parent))
    via_cli = ["-m", "dynamix_gym.cli"] if script is None else [script]
    args = ["controller=dlb", "env.max_decisions=2"]
    a = run_python([*via_cli, "evaluate", *args, f"hydra.run.dir={tmp_path / 'cli'}"], timeout=300)
    b = run_python(["-m", "experiments.evaluate", *args, f"hydra.run.dir={tmp_path / 'module'}"], timeout=300)
    assert a.returncode == 0 and b.returncode == 0, a.stderr[-3000:] + b.stderr[-3000:]
    rows = [pd.read_csv(tmp_path / run / "summary.csv") for run in ("cli", "module")]
    measured = ["decision_time_ms"]  # the controller's wall-clock time per decision
    pd.testing.assert_frame_equal(rows[0].drop(columns=measured), rows[1].drop(columns=measured))
