"""The ``corrgrpo advantages`` command: the worked example and reward files."""

from __future__ import annotations

import json

import numpy as np
import pytest

from corrgrpo.trainer.cli import main
from corrgrpo.trainer.commands.advantages import PAPER_COVARIANCE, worked_example_rewards


def test_worked_example_data_has_the_paper_covariance() -> None:
    np.testing.assert_allclose(np.cov(worked_example_rewards(), rowvar=False), PAPER_COVARIANCE, atol=1e-12)


def test_demo_prints_the_paper_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["advantages", "--demo"]) == 0
    out = capsys.readouterr().out
    for number in ("0.2536", "0.4307", "91.1%", "8.89x", "15.5521", "5.3907", "0.9758", "0.1098", "14.16960"):
        assert number in out, number
    assert "+1.5013" in out and "+0.8839" in out  # the same rollout under CorrGRPO and GRPO


def test_rewards_json_file(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "batch.json"
    path.write_text(
        json.dumps(
            {
                "rewards": [[1.0, None], [3.0, 2.0], [5.0, 4.0], [1.0, 1.0], [1.0, 1.0]],
                "group_ids": [7, 7, 7, 3, 3],
                "names": ["pass", "style"],
            }
        )
    )
    assert main(["advantages", "--rewards", str(path)]) == 0
    out = capsys.readouterr().out
    # group 7: N = (-2, -1, 3), S_corr = 3 -> -2 / sqrt(3) = -1.1547
    assert "-1.1547" in out and "+1.7321" in out
    assert "zero variance" in out and "zero-variance groups: 50.0%" in out


def test_rewards_csv_file_with_estimator_and_option(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "batch.csv"
    path.write_text("group_id,a,b\n0,1,0\n0,0,0\n1,3,1\n1,1,1\n")
    argv = ["advantages", "--rewards", str(path), "--estimator", "grpo", "-o", "scale=none"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "+0.5000" in out and "-1.0000" in out


def test_bad_reward_file_reports_error(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "batch.csv"
    path.write_text("group_id,a\n0,inf\n0,1\n")
    assert main(["advantages", "--rewards", str(path)]) == 2
    assert "inf" in capsys.readouterr().err
    assert main(["advantages", "--rewards", str(path), "--estimator", "nope"]) == 2
    assert "available" in capsys.readouterr().err


def test_no_source_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["advantages"]) == 2
