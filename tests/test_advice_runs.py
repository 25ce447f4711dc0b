"""`corrgrpo advise` on TRL and verl runs: their log files, written here, give the same findings as ours."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import corrgrpo.trainer.integrations.run_logs as run_logs
from corrgrpo.trainer.advice import advise
from corrgrpo.trainer.cli import main
from corrgrpo.trainer.integrations.run_logs import read_run

NAMES = ["big", "a", "b"]


def _ours(**changes) -> dict:
    """One step's metrics as CorrGRPOTrainer logs them (``corrgrpo/`` prefix, pairs as scalars)."""
    metrics = {
        **{f"reward/{n}/mean": 0.5 for n in NAMES}, "reward/weighted/mean": 1.0,
        "cov_share/big": 0.4, "cov_share/a": 0.3, "cov_share/b": 0.3,
        "reward_correlation/big/a": 0.2, "reward_correlation/big/b": 0.1, "reward_correlation/a/b": 0.3,
        "k_eff/mean": 2.5, **{f"active_fraction/{n}": 1.0 for n in NAMES},
        "zero_variance_fraction": 0.0, "c_q/median": 1.1,
    }
    metrics.update(changes)
    return {f"corrgrpo/{k}": v for k, v in metrics.items()}


def _trl_run(folder: Path, steps: int = 4, own: dict | None = None, plain: bool = False, **changes) -> Path:
    """A TRL output folder: ``checkpoint-N/trainer_state.json`` with a log_history like TRL's."""
    history = []
    for step in range(1, steps + 1):
        entry = {"loss": 0.01, "grad_norm": 0.5, "rewards/big/mean": 3.0, "reward": 1.0,
                 "frac_reward_zero_std": 0.0, "step_time": 0.2, "epoch": step / steps, "step": step}
        entry.update(own or {})
        if not plain:
            entry.update(_ours(**changes))
        history.append(entry)
    history.append({"eval_loss": 9.0, "eval_corrgrpo/k_eff/mean": 1.0, "step": steps})  # evaluation: left out
    history.append({"train_runtime": 1.0, "train_loss": 0.0, "step": steps})
    for n, log in ((steps // 2, history[: steps // 2]), (steps, history)):
        (folder / f"checkpoint-{n}").mkdir(parents=True)
        (folder / f"checkpoint-{n}" / "trainer_state.json").write_text(json.dumps({"log_history": log}))
    return folder


def _verl_run(path: Path, steps: int = 4, own: dict | None = None, plain: bool = False, **changes) -> Path:
    """verl's file logger: one ``{"step": N, "data": {...}}`` per line."""
    with open(path, "w") as f:
        for step in range(1, steps + 1):
            data = {"actor/grad_norm": 0.5, "critic/score/mean": 1.0, **(own or {})}
            if not plain:
                data.update(_ours(**changes))
            f.write(json.dumps({"step": step, "data": data}) + "\n")
    return path


def _conditions(run) -> set[str]:
    return {f.condition for f in advise([run])}


def test_a_healthy_trl_run_and_a_healthy_verl_run_show_no_condition(tmp_path):
    assert _conditions(_trl_run(tmp_path / "trl")) == set()
    assert _conditions(_verl_run(tmp_path / "verl.jsonl")) == set()


@pytest.mark.parametrize(("condition", "changes"), [
    ("dominant", {"cov_share/big": 0.95, "cov_share/a": 0.03, "cov_share/b": 0.02}),
    ("duplicates", {"reward_correlation/a/b": 0.97}),
    ("k_eff_one", {"k_eff/mean": 1.1}),
    ("never_varies", {"active_fraction/b": 0.0}),
    ("zero_variance", {"zero_variance_fraction": 0.8}),
    ("c_q_far", {"c_q/median": 0.28}),
])
def test_each_condition_from_trl_and_verl_logs(tmp_path, condition, changes):
    trl = _trl_run(tmp_path / "trl", **changes)
    verl = _verl_run(tmp_path / "verl.jsonl", **changes)
    assert _conditions(trl) == {condition} and _conditions(verl) == {condition}
    assert _conditions(trl / "checkpoint-4" / "trainer_state.json") == {condition}


def test_the_numbers_are_those_of_the_log(tmp_path):
    trl = _trl_run(tmp_path / "trl", **{"reward_correlation/a/b": 0.95, "cov_share/big": 0.9,
                                         "cov_share/a": 0.05, "cov_share/b": 0.05})
    findings = {f.condition: f for f in advise([trl])}
    assert findings["duplicates"].numbers == {"components": ["a", "b"], "correlation": 0.95, "steps": 4}
    assert findings["dominant"].numbers["cov_share"] == {"big": 0.9, "a": 0.05, "b": 0.05}
    log = read_run(trl)
    assert log.kind == "trl" and log.path.parent.name == "checkpoint-4" and len(log.records) == 4  # the newest
    assert log.records[0]["reward_names"] == NAMES
    assert log.records[0]["reward_correlation"] == [[1.0, 0.2, 0.1], [0.2, 1.0, 0.95], [0.1, 0.95, 1.0]]


def test_a_run_without_our_diagnostics_is_judged_on_its_own_metrics(tmp_path, capsys):
    trl = _trl_run(tmp_path / "trl", plain=True, own={"frac_reward_zero_std": 0.75})
    findings = {f.condition: f for f in advise([trl])}
    assert set(findings) == {"zero_variance", "no_diagnostics"}
    assert findings["zero_variance"].numbers == {"zero_variance_fraction": 0.75}
    assert "docs/trl.md" in findings["no_diagnostics"].link
    verl = _verl_run(tmp_path / "verl.jsonl", steps=12, plain=True)
    with open(verl, "a") as f:  # the gradient norm rises 4x over the run
        for step in range(13, 25):
            f.write(json.dumps({"step": step, "data": {"actor/grad_norm": 2.0}}) + "\n")
    findings = {f.condition: f for f in advise([verl])}
    assert set(findings) == {"grad_drift", "no_diagnostics"}
    assert findings["grad_drift"].numbers["grad_norm"]["ratio"] == pytest.approx(4.0)
    assert "register our estimators in verl" in findings["no_diagnostics"].advice
    assert main(["advise", str(trl)]) == 0
    out = " ".join(capsys.readouterr().out.split())  # the text is wrapped to the terminal
    assert "[no_diagnostics]" in out and "75% of the groups" in out


def test_a_verl_run_still_writing_loses_only_its_torn_last_line(tmp_path):
    verl = _verl_run(tmp_path / "verl.jsonl", **{"k_eff/mean": 1.1})
    with open(verl, "a") as f:
        f.write('{"step": 5, "data": {"corrgrpo/k_eff')
    assert len(read_run(verl).records) == 4 and _conditions(verl) == {"k_eff_one"}


@pytest.mark.parametrize(("content", "message"), [
    ('{"step": 1, "data": {}}\nnot json\n{"step": 3, "data": {}}\n', "verl.jsonl:2: not a JSON line"),
    ('{"step": 1, "metrics": {}}\n', "verl.jsonl:1: not a verl file-logger line"),
    ("[1, 2]\n", "verl.jsonl:1: not a verl file-logger line"),
])
def test_malformed_verl_logs_are_refused_in_one_line(tmp_path, capsys, content, message):
    path = tmp_path / "verl.jsonl"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        read_run(path)
    assert main(["advise", str(path)]) == 2
    out = capsys.readouterr().out
    assert out.startswith("error: ") and message in out and out.count("\n") == 1


@pytest.mark.parametrize("content", ["{not json", '{"log_history": 3}', "[]"])
def test_malformed_trl_states_are_refused(tmp_path, content):
    (tmp_path / "trainer_state.json").write_text(content)
    with pytest.raises(ValueError, match="trainer_state.json"):
        read_run(tmp_path)


def test_an_oversized_log_and_a_folder_that_is_no_run_are_refused(tmp_path, monkeypatch, capsys):
    verl = _verl_run(tmp_path / "verl.jsonl")
    monkeypatch.setattr(run_logs, "MAX_LOG_BYTES", 100)
    with pytest.raises(ValueError, match="over the 100-byte limit"):
        read_run(verl)
    (tmp_path / "empty").mkdir()
    assert main(["advise", str(tmp_path / "empty")]) == 2
    assert "not a run" in capsys.readouterr().out


def test_hostile_values_in_a_log_are_ignored(tmp_path):
    """Strings, booleans, NaN and nested objects where numbers belong do not count and do not crash."""
    verl = _verl_run(tmp_path / "verl.jsonl", **{"k_eff/mean": "1.0", "c_q/median": True,
                                                 "cov_share/big": {"x": 1}, "reward_correlation/a/b": None})
    with open(verl, "a") as f:
        f.write(json.dumps({"step": 9, "data": {"corrgrpo/zero_variance_fraction": float("nan"), 3: 4}}) + "\n")
    records = read_run(verl).records
    assert all("k_eff/mean" not in r and "c_q/median" not in r for r in records)
    assert _conditions(verl) == set()


def _trl_tensorboard_run(folder: Path, steps: int = 4, **changes) -> Path:
    """A TRL output folder saved without trainer_state.json: the TensorBoard events of
    ``report_to="tensorboard"``, written by transformers' own callback (the one TRL's trainer uses),
    and the ``training_args.bin`` of ``trainer.save_model()``."""
    from transformers import TrainerControl, TrainerState, TrainingArguments
    from transformers.integrations import TensorBoardCallback

    args, state, control = TrainingArguments(output_dir=str(folder), report_to="tensorboard"), TrainerState(), TrainerControl()
    callback = TensorBoardCallback()
    callback.on_train_begin(args, state, control)
    for step in range(1, steps + 1):
        state.global_step = step
        callback.on_log(args, state, control, logs={"loss": 0.01, "grad_norm": 0.5, "rewards/big/mean": 3.0,
                                                    "frac_reward_zero_std": 0.0, "epoch": step / steps, **_ours(**changes)})
    callback.on_log(args, state, control, logs={"eval_loss": 9.0, "eval_corrgrpo/k_eff/mean": 1.0})  # left out
    callback.on_log(args, state, control, logs={"train_runtime": 1.0, "train_loss": 0.0})
    callback.on_train_end(args, state, control)
    (folder / "training_args.bin").write_bytes(b"")
    return folder


def test_a_trl_run_saved_without_trainer_state_is_read_from_its_tensorboard_events(tmp_path):
    dup = {"reward_correlation/a/b": 0.95, "cov_share/big": 0.9, "cov_share/a": 0.05, "cov_share/b": 0.05}
    trl = _trl_tensorboard_run(tmp_path / "trl", **dup)
    (events,) = (trl / "runs").glob("*/events.out.tfevents.*")
    log = read_run(trl)
    assert log.kind == "trl" and log.path == events.parent and log.has_diagnostics and log.estimator is None
    assert [r["step"] for r in log.records] == [1, 2, 3, 4] and log.records[0]["reward_names"] == NAMES
    assert log.records[0]["grad_norm"] == 0.5 and log.records[0]["reward_correlation"][1][2] == pytest.approx(0.95)
    findings = {f.condition: f for f in advise([trl])}
    assert set(findings) == {"dominant", "duplicates"}  # the evaluation's K_eff of 1.0 is not a training step
    assert findings["duplicates"].numbers["correlation"] == pytest.approx(0.95)
    assert _conditions(trl / "runs") == _conditions(events.parent) == {"dominant", "duplicates"}
    # beside an older checkpoint's trainer_state.json (2 steps), the events (4 steps) are read
    (trl / "checkpoint-2").mkdir()
    (trl / "checkpoint-2" / "trainer_state.json").write_text(json.dumps({"log_history": [
        {"step": s, "grad_norm": 0.5, **_ours(**{"k_eff/mean": 1.1})} for s in (1, 2)]}))
    assert len(read_run(trl).records) == 4 and _conditions(trl) == {"dominant", "duplicates"}


def test_a_trl_folder_with_no_log_says_how_to_get_one(tmp_path, capsys):
    (tmp_path / "trl").mkdir()
    (tmp_path / "trl" / "training_args.bin").write_bytes(b"")
    assert main(["advise", str(tmp_path / "trl")]) == 2
    out = capsys.readouterr().out
    assert out.startswith(f"error: {tmp_path / 'trl'}: a TRL output folder without a log advise reads: ")
    assert "trainer.save_state() after trainer.train()" in out and "report_to='tensorboard'" in out
    # unreadable events: one line naming the file
    (tmp_path / "trl" / "runs" / "x").mkdir(parents=True)
    (tmp_path / "trl" / "runs" / "x" / "events.out.tfevents.1.host.1.0").write_bytes(bytes(range(256)))
    with pytest.raises(ValueError, match="no training scalars"):
        read_run(tmp_path / "trl")


def test_the_estimator_a_trl_or_verl_run_logged_is_the_one_advise_names(tmp_path):
    named = {"estimator_used/gdpo": 1.0, "c_q/median": 0.28}
    trl = _trl_run(tmp_path / "trl", **named)
    verl = _verl_run(tmp_path / "verl.jsonl", **named)
    for run in (trl, verl):
        assert read_run(run).estimator == "gdpo"
        far = [f for f in advise([run]) if f.condition == "c_q_far"]
        assert len(far) == 1 and "this gdpo run's batches have a median c_q of 0.28" in far[0].summary
    assert read_run(_verl_run(tmp_path / "plain.jsonl")).estimator is None  # a log that does not say
