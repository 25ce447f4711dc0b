"""`corrgrpo sweep`: the weight grid, the front's statistics (intervals, non-dominated set, pymoo's
hypervolume), and a tiny sweep that skips finished runs, resumes a torn one and evaluates one
whose evaluation was lost."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from corrgrpo.trainer.cli import main
from corrgrpo.trainer.pareto import hypervolume, interval, non_dominated, percent_of_range
from corrgrpo.trainer.sweep import SweepRun, Weighting, parse_weights, simplex, write_front

pytest.importorskip("pymoo", reason="pymoo (the dev extra) computes the hypervolume")

NAMES, LOW, HIGH = ["digits", "has_a", "word_with_a"], [0.0, 0.0, 0.0], [32.0, 1.0, 1.0]


def test_simplex_points():
    points = simplex(3, 2)
    assert len(points) == 6 and all(sum(p) == pytest.approx(1.0) for p in points)
    assert points[0] == [1.0, 0.0, 0.0] and [0.5, 0.5, 0.0] in points
    assert len(simplex(2, 4)) == 5 and len(simplex(4, 3)) == 20  # C(N+K-1, K-1)


def test_simplex_weights_are_per_unit_of_range_and_files_are_used_as_given(tmp_path):
    grid = parse_weights("simplex:2", NAMES, LOW, HIGH)
    half = next(w for w in grid if w.given == [0.5, 0.5, 0.0])
    assert half.reward_weights == pytest.approx([0.5 / 32, 0.5, 0.0])
    path = tmp_path / "w.yaml"
    path.write_text("- [1, 0, 0]\n- {has_a: {values: [[0, 0.5], [10, 1.5]]}}\n")
    weights = parse_weights(str(path), NAMES, LOW, HIGH)
    assert [w.reward_weights for w in weights] == [[1, 0, 0], {"has_a": {"values": [[0, 0.5], [10, 1.5]]}}]
    path.write_text("- [1, 0]\n")
    with pytest.raises(ValueError, match=r"w.yaml\[0\] has 2 entries for 3 rewards"):
        parse_weights(str(path), NAMES, LOW, HIGH)
    with pytest.raises(FileNotFoundError, match="not simplex:N and no such file"):
        parse_weights("simplex3", NAMES, LOW, HIGH)


def test_front_statistics():
    assert percent_of_range([16.0, 0.25, 1.0], LOW, HIGH).tolist() == [50.0, 25.0, 100.0]
    mean, half = interval([1.0, 2.0, 3.0])
    assert mean == 2.0 and half == pytest.approx(4.303 * 1.0 / np.sqrt(3), rel=1e-3)  # t(0.975, 2) = 4.303
    assert interval([5.0]) == (5.0, None)
    points = np.array([[50.0, 50.0], [80.0, 10.0], [40.0, 40.0], [80.0, 5.0]])
    assert non_dominated(points).tolist() == [True, True, False, False]
    # the union of [0, 50] x [0, 50] and [0, 80] x [0, 10]
    assert hypervolume(points[:2]) == pytest.approx(50 * 50 + 30 * 10)
    assert hypervolume(np.array([[100.0, 100.0, 100.0]])) == pytest.approx(1e6)


def test_write_front_from_eval_files(tmp_path):
    weightings = [Weighting(0, [1, 0, 0], [1 / 32, 0, 0]), Weighting(1, [0, 1, 0], [0, 1, 0])]
    runs = []
    values = {(0, 0): [16, 0.5, 0.5], (0, 1): [24, 0.5, 0.5], (1, 0): [8, 1.0, 1.0], (1, 1): [8, 0.75, 0.75]}
    for (w, seed), means in values.items():
        run = SweepRun("grpo", weightings[w], seed, tmp_path / "grpo" / f"w{w}-s{seed}")
        run.folder.mkdir(parents=True)
        records = [{"reward_components": dict(zip(NAMES, means))}] * 3
        (run.folder / "eval.json").write_text(json.dumps({"records": records}))
        runs.append(run)
    # a second estimator: one weighting, dominated overall by grpo's w0 but its own front
    other = SweepRun("gdpo", weightings[0], 0, tmp_path / "gdpo" / "w0-s0")
    other.folder.mkdir(parents=True)
    (other.folder / "eval.json").write_text(json.dumps({"records": [{"reward_components": dict(zip(NAMES, [8, 0.5, 0.5]))}]}))
    runs.append(other)
    grid = {"config": "toy", "names": NAMES, "low": LOW, "high": HIGH, "steps": 2}
    front = write_front(tmp_path, runs, grid)
    assert [(p["estimator"], p["weighting"]) for p in front["points"]] == [("gdpo", 0), ("grpo", 0), ("grpo", 1)]
    assert front["points"][0]["percent"]["digits"]["ci95"] is None  # one seed: no interval
    assert front["non_dominated_by_estimator"] == {"gdpo": [0], "grpo": [1, 2]}
    assert front["hypervolume_by_estimator"]["gdpo"] == pytest.approx(25 * 50 * 50)
    front["points"] = front["points"][1:]  # grpo's own numbers below
    first = front["points"][0]["percent"]["digits"]
    assert first["mean"] == pytest.approx(62.5) and first["per_seed"] == [50.0, 75.0]
    assert first["ci95"] == pytest.approx(12.706 * np.std([50, 75], ddof=1) / np.sqrt(2), rel=1e-3)
    assert front["non_dominated"] == [1, 2]
    # (62.5, 50, 50) and (25, 87.5, 87.5): 62.5*50*50 + 25*(87.5^2 - 50^2) -> in percent^3
    assert front["hypervolume"] == pytest.approx(62.5 * 50 * 50 + 25 * (87.5**2 - 50**2))
    assert front["reference_point"]["percent"] == [0.0, 0.0, 0.0]
    assert (tmp_path / "front.png").stat().st_size > 10_000


TINY = ["env.num_tasks=16", "model.name_or_path=tiny", "algorithm.group_size=4", "algorithm.prompts_per_step=2",
        "rollout.max_new_tokens=8", "train.steps=2", "train.tensorboard=false", "train.log_samples=0"]


@pytest.mark.slow
def test_a_sweep_skips_finished_runs_resumes_torn_ones_and_evaluates_lost_evaluations(tmp_path, capsys):
    weights = tmp_path / "weights.json"
    weights.write_text(json.dumps([[1 / 32, 0, 0], [0, 1, 1]]))
    out = tmp_path / "sweep"
    args = ["sweep", "env_configs/quickstart.yaml", *TINY, "--weights", str(weights), "--seeds", "1",
            "--estimators", "grpo", "--parallel", "2", "--out", str(out), "--save-every", "1"]
    assert main(args) == 0
    front = json.loads((out / "front.json").read_text())
    assert front["runs_done"] == {"trained": 2, "resumed": 0, "evaluated": 0, "skipped": 0}
    assert [p["weighting"] for p in front["points"]] == [0, 1]
    assert json.loads((out / "grpo" / "w0-s0" / "eval.json").read_text())["greedy"] is True
    # a torn run (its last checkpoint and evaluation gone) and a lost evaluation
    torn, lost = out / "grpo" / "w0-s0", out / "grpo" / "w1-s0"
    shutil.rmtree(torn / "checkpoint-2")
    (torn / "eval.json").unlink()
    (lost / "eval.json").unlink()
    assert main(args) == 0
    again = json.loads((out / "front.json").read_text())
    assert again["runs_done"] == {"trained": 0, "resumed": 1, "evaluated": 1, "skipped": 0}
    steps = [json.loads(line)["step"] for line in (torn / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]  # resumed after step 1, not started again
    assert main(args) == 0
    assert json.loads((out / "front.json").read_text())["runs_done"]["skipped"] == 2
    assert "hypervolume (percent^3, reference 0 %)" in capsys.readouterr().out
    assert Path(out / "front.png").exists()
