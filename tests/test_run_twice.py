"""Every command run twice in a row in one folder, with every installed logger on.

A user runs ``corrgrpo train quickstart.yaml`` a second time in the same folder: the run folder
(``runs/<config name>-<estimator>-s<seed>``) holds the first run's logs. The second run moves them
aside and starts afresh, ``train.resume=auto`` continues them, and ``sft``, ``sweep`` and
``eval`` behave the same way; none ends in a traceback. TensorBoard once did: its event file was
opened before the earlier logs were moved aside, under the folder that moved.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from corrgrpo.trainer.cli import main
from corrgrpo.trainer.run_logger import read_metrics

LOGGERS = ("tensorboard", "wandb", "mlflow")
TINY = [
    "env.num_tasks=8", "model.name_or_path=tiny", "algorithm.group_size=2", "algorithm.prompts_per_step=2",
    "rollout.max_new_tokens=4", "rollout.torch_threads=1", "train.progress=false", "train.log_samples=1",
]


def _installed_loggers() -> list[str]:
    from accelerate.tracking import get_available_trackers

    available = {str(t) for t in get_available_trackers()}
    return [name for name in LOGGERS if name in available]


@pytest.fixture
def folder(tmp_path, monkeypatch) -> Path:
    """A user's working folder, with every installed logger writing locally inside it."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "mlruns").as_uri())
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3's local files
    return tmp_path


def _report_to() -> str:
    loggers = _installed_loggers()
    return f"train.report_to=[{','.join(loggers)}]" if loggers else "train.report_to=none"


def _tensorboard_steps(run: Path, key: str) -> list[int]:
    """The steps of ``key`` TensorBoard shows for ``run`` (its purges applied)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (folder,) = {p.parent for p in (run / "tensorboard").rglob("events.out.tfevents.*")
                 if not p.parent.name.replace(".", "").isdigit()}  # not the hparams' own folders
    events = EventAccumulator(str(folder))
    events.Reload()
    return [e.step for e in events.Scalars(key)]


@pytest.mark.timeout(300)
def test_train_twice_then_resumed_then_evaluated_twice(folder):
    run = folder / "runs" / "quickstart-corrgrpo-s0"
    train = ["train", "quickstart.yaml", *TINY, "train.steps=2", "train.save_every=1", _report_to()]
    assert main(train) == 0
    first = read_metrics(run)
    assert main(train) == 0  # the earlier run's logs are there: moved aside, not mixed in
    assert [r["step"] for r in read_metrics(run)] == [1, 2]
    (old,) = run.glob("metrics.jsonl.old-*")
    assert [json.loads(line) for line in old.read_text().splitlines()] == first
    if "tensorboard" in _installed_loggers():
        assert len(list(run.glob("tensorboard.old-*"))) == 1
        assert _tensorboard_steps(run, "reward/weighted/mean") == [1, 2]

    # resumed from the step-1 checkpoint: the records after it are rewritten, in both the
    # metrics and TensorBoard (which hides the earlier run's step 2 instead of showing two)
    shutil.rmtree(run / "checkpoint-2")
    assert main([*train, "train.steps=3", "train.resume=auto"]) == 0
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 3]
    if "tensorboard" in _installed_loggers():
        assert _tensorboard_steps(run, "reward/weighted/mean") == [1, 2, 3]
    if "wandb" in _installed_loggers():
        assert len(list((run / "wandb").glob("offline-run-*"))) == 3

    evaluate = ["eval", "quickstart.yaml", *TINY, "--checkpoint", str(run / "checkpoint-3"), "--limit", "2"]
    assert main(evaluate) == 0
    written = run / "checkpoint-3" / "eval-eval-model.json"
    result = json.loads(written.read_text())
    assert main(evaluate) == 0  # the same greedy evaluation, written over the first
    assert json.loads(written.read_text())["metrics"] == result["metrics"] and result["tasks"] == 2


@pytest.mark.timeout(300)
def test_sft_twice_then_resumed(folder):
    run = folder / "runs" / "sft_toolcall_tiny"
    sft = ["sft", "sft_toolcall_tiny.yaml", "env.num_tasks=12", "train.steps=2", "train.batch_size=1",
           "train.save_every=1", "train.eval_every=0", "data.max_eval_examples=1", "train.progress=false",
           _report_to()]
    assert main(sft) == 0
    assert main(sft) == 0
    steps = [r["step"] for r in read_metrics(run)]
    assert steps[-1] == 2 and len(list(run.glob("metrics.jsonl.old-*"))) == 1
    shutil.rmtree(run / "checkpoint-2")
    assert main([*sft, "train.steps=3", "train.resume=auto"]) == 0
    assert [r["step"] for r in read_metrics(run)][-3:] == [1, 2, 3]
    assert (run / "model" / "config.json").exists()


@pytest.mark.timeout(300)
def test_sweep_twice_then_with_a_torn_run(folder, capsys):
    out = folder / "runs" / "sweep-quickstart"
    weights = folder / "weights.json"
    weights.write_text(json.dumps([[1 / 32, 1, 1]]))
    sweep = ["sweep", "quickstart.yaml", *TINY, "train.steps=2", _report_to(), "--weights", str(weights),
             "--seeds", "1", "--estimators", "grpo", "--save-every", "1", "--eval-limit", "2"]
    assert main(sweep) == 0
    assert main(sweep) == 0  # finished: skipped, its table printed again
    assert json.loads((out / "front.json").read_text())["runs_done"]["skipped"] == 1
    torn = out / "grpo" / "w0-s0"
    shutil.rmtree(torn / "checkpoint-2")
    (torn / "eval.json").unlink()
    assert main(sweep) == 0
    assert json.loads((out / "front.json").read_text())["runs_done"]["resumed"] == 1
    assert [r["step"] for r in read_metrics(torn)] == [1, 2]
    assert capsys.readouterr().out.count("hypervolume") == 3
