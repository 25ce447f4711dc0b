"""The train, eval and plot commands."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from corrgrpo.trainer.cli import main

TOY = [
    "env.num_tasks=16", "model.name_or_path=tiny", "algorithm.group_size=4",
    "algorithm.prompts_per_step=4", "rollout.max_new_tokens=8", "rollout.torch_threads=1", "train.progress=false",
    "train.tensorboard=false",
]


def test_train_then_eval_checkpoint_then_plot(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "env_configs/quickstart.yaml", *TOY, "train.steps=2",
                 f"train.output_dir={run}"]) == 0
    assert (run / "checkpoint-2" / "model" / "config.json").exists()
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 2
    assert (run / "config.json").exists() and (run / "samples.jsonl").exists()

    out = tmp_path / "eval.json"
    assert main(["eval", "env_configs/quickstart.yaml", *TOY, "--checkpoint",
                 str(run / "checkpoint-2"), "--split", "all", "--limit", "6",
                 "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["tasks"] == 6 and len(result["records"]) == 6
    assert set(result["metrics"]) >= {"digits", "has_a", "word_with_a", "total"}
    assert result["greedy"] is True

    png = tmp_path / "plot.png"
    assert main(["plot", str(run), str(run), "--labels", "a", "b", "--out", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_eval_reference_policy_scores_the_reference(tmp_path):
    out = tmp_path / "ref.json"
    assert main(["eval", "env_configs/quickstart.yaml", *TOY, "--policy", "reference",
                 "--split", "all", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["tasks"] == 16
    assert result["metrics"]["has_a"] == 1.0 and result["metrics"]["word_with_a"] == 1.0
    assert result["metrics"]["digits"] == pytest.approx(32.0)


def test_overrides_may_follow_the_options(tmp_path, capsys):
    """``eval run.yaml --limit 2 KEY=VALUE``: the overrides after an option are the run's too."""
    out = tmp_path / "ref.json"
    assert main(["eval", "env_configs/quickstart.yaml", *TOY[:2], "--policy", "reference", "--split", "all",
                 "--out", str(out), *TOY[2:], "env.num_tasks=6"]) == 0
    assert json.loads(out.read_text())["tasks"] == 6  # the last override wins, as before the options
    with pytest.raises(SystemExit) as info:
        main(["eval", "env_configs/quickstart.yaml", "--limit", "2", "--bogus", "train.seed=1"])
    assert info.value.code == 2
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err


def test_train_rejects_bad_override(capsys):
    assert main(["train", "env_configs/quickstart.yaml", "algorithm.estimatr=grpo"]) == 2
    err = capsys.readouterr().err
    assert "unknown key 'algorithm.estimatr'" in err


def test_missing_config_is_a_clear_error(capsys):
    assert main(["train", "no_such_config.yaml"]) == 2
    assert "not found" in capsys.readouterr().err


def test_plot_rejects_a_folder_without_metrics(tmp_path):
    with pytest.raises(FileNotFoundError, match="run folder"):
        main(["plot", str(Path(tmp_path))])


def test_train_uses_estimator_and_loss_entry_points(tmp_path, monkeypatch):
    """``corrgrpo train cfg algorithm.estimator=pkg.mod:fn`` needs no launcher."""
    import sys
    import textwrap

    (tmp_path / "my_rl_plugins.py").write_text(textwrap.dedent("""
        from corrgrpo.trainer.losses import LossInputs, LossOutput

        CALLS = {"estimator": 0, "loss": 0}

        def half_dr_grpo(groups, *, factor: float = 0.5):
            CALLS["estimator"] += 1
            return factor * groups.weighted.sum(dim=1)

        def reinforce(inputs: LossInputs) -> LossOutput:
            CALLS["loss"] += 1
            x = inputs
            return LossOutput(-(x.advantages[:, None] * x.logp * x.mask).sum() / x.token_denominator)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    run = tmp_path / "run"
    assert main(["train", "env_configs/quickstart.yaml", *TOY, "train.steps=1", "train.save_final=false",
                 f"train.output_dir={run}", "algorithm.estimator=my_rl_plugins:half_dr_grpo",
                 "algorithm.estimator_options={factor: 0.25}", "algorithm.loss=my_rl_plugins:reinforce"]) == 0
    plugins = sys.modules.pop("my_rl_plugins")
    assert plugins.CALLS["estimator"] >= 2 and plugins.CALLS["loss"] >= 1  # config check + the step
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 1


def test_unknown_env_id_is_one_error_line_before_any_model_loads(capsys, monkeypatch):
    import corrgrpo.trainer.trainer as trainer_module

    def no_trainer(*a, **k):
        raise AssertionError("the trainer was built")

    monkeypatch.setattr(trainer_module, "Trainer", no_trainer)
    assert main(["train", "env_configs/quickstart.yaml", "env.id=corrgrpo/NoSuch-v0"]) == 2
    err = capsys.readouterr().err
    # the error names the override that set the id, like every other key's error
    assert err.startswith("error: override 'env.id=corrgrpo/NoSuch-v0': env.id: unknown env id "
                          "'corrgrpo/NoSuch-v0'; registered: ") and "Traceback" not in err
    assert main(["train", "env_configs/quickstart.yaml", "env.id=no_such_pkg.envs:Env"]) == 2
    err = capsys.readouterr().err
    assert "cannot import 'no_such_pkg'" in err and "working directory" in err


def test_eval_missing_checkpoint_is_one_error_line(capsys):
    assert main(["eval", "env_configs/quickstart.yaml", "--checkpoint", "no/such/checkpoint"]) == 2
    err = capsys.readouterr().err
    assert "error: --checkpoint no/such/checkpoint: no such folder" in " ".join(err.split())


def test_progress_line_keeps_bar_and_step_count_in_80_columns():
    from rich.console import Console

    from corrgrpo.trainer.progress import TrainProgress

    progress = TrainProgress(10)
    progress.update(3, {"reward/weighted/mean": 2.0, "reward/has_a/mean": 0.9, "reward/word_with_a/mean": 0.9,
                        "reward/digits/mean": 0.14, "c_q/median": 0.35, "time/step": 12.6})
    console = Console(width=80, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(progress._progress.get_renderable())
    text = console.export_text()
    first, *rest = text.splitlines()  # the numbers wrap rather than being cut
    assert first.startswith("train ━━━━") and " 3/10 " in first and "R=2.000" in first
    assert all(len(line) <= 80 for line in [first, *rest]) and "…" not in text and "digits=0.14" in text


def test_rollout_server_failure_ends_in_one_error_line(capsys, monkeypatch):
    import corrgrpo.trainer.trainer as trainer_module
    from corrgrpo.trainer.server_engine import RolloutServerError

    class DownTrainer:
        def __init__(self, cfg):
            raise RolloutServerError("rollout server http://127.0.0.1:9: GET /v1/models failed: ConnectError", "x")

    monkeypatch.setattr(trainer_module, "Trainer", DownTrainer)
    assert main(["train", "env_configs/quickstart.yaml"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: rollout server http://127.0.0.1:9") and "Traceback" not in err


def test_the_command_destroys_the_process_group_a_launched_run_left(tmp_path, monkeypatch):
    """A launched run's gloo group is destroyed when the command returns, not left to the exit."""
    import torch.distributed as dist

    def run_in_a_group(args):  # what `corrgrpo train` does under `accelerate launch`, in one process
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
        assert dist.is_initialized()
        return 0

    import corrgrpo.trainer.commands.advantages as command

    monkeypatch.setattr(command, "run", run_in_a_group)
    assert main(["advantages"]) == 0
    assert not dist.is_initialized()
