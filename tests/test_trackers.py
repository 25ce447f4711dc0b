"""Experiment trackers through Accelerate (``train.report_to``): each tracker that installs here
receives the logged keys in its offline or local mode; the others skip with the reason; the
setting is checked with the config; ``metrics.jsonl`` is written whatever is chosen."""

from __future__ import annotations

import importlib.util
import json
import warnings
from pathlib import Path

import pytest
import yaml

from corrgrpo.trainer.cli import main
from corrgrpo.trainer.config import ConfigError, load_config

TOY = [
    "env.num_tasks=8", "model.name_or_path=tiny", "algorithm.group_size=2",
    "algorithm.prompts_per_step=2", "rollout.max_new_tokens=4", "rollout.torch_threads=1",
    "train.progress=false", "train.steps=2", "train.log_samples=0",
]
KEYS = ("reward/weighted/mean", "loss/ratio_mean", "c_q/median")


def _train(tmp_path: Path, *overrides: str) -> Path:
    out = tmp_path / "run"
    assert main(["train", "quickstart.yaml", *TOY, f"train.output_dir={out}", *overrides]) == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]  # written whatever the trackers
    return out


def _needs(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed here (pip install {module}); its tracker is not tested")


# ------------------------------------------------------------------ the setting
def test_report_to_takes_a_name_a_list_or_none():
    assert load_config("quickstart.yaml", []).train.trackers() == ["tensorboard"]
    assert load_config("quickstart.yaml", ["train.report_to=wandb"]).train.trackers() == ["wandb"]
    both = load_config("quickstart.yaml", ["train.report_to=[mlflow,wandb,mlflow]"]).train
    assert both.trackers() == ["mlflow", "wandb"]
    assert load_config("quickstart.yaml", ["train.report_to=none"]).train.trackers() == []
    older = load_config("quickstart.yaml", ["train.report_to=[tensorboard,wandb]", "train.tensorboard=false"])
    assert older.train.trackers() == ["wandb"]


@pytest.mark.parametrize("value, message", [
    ("wandbb", "train.report_to: 'wandbb' is not allowed; allowed values: one of 'tensorboard', 'wandb'"),
    ("[none,wandb]", "train.report_to: 'none' cannot be combined with other trackers"),
])
def test_a_bad_tracker_is_named_before_anything_loads(value, message):
    with pytest.raises(ConfigError) as info:
        load_config("quickstart.yaml", [f"train.report_to={value}"])
    assert message in str(info.value)


def test_a_tracker_that_is_not_installed_is_one_line_naming_its_install_and_the_run_goes_on(tmp_path, capsys):
    from corrgrpo.trainer.run_context import _available_trackers, missing_trackers_line

    if importlib.util.find_spec("swanlab") is not None:
        pytest.skip("swanlab is installed here")
    assert _available_trackers(["tensorboard", "swanlab"]) == (["tensorboard"], ["swanlab"])
    assert missing_trackers_line(["swanlab"]) == (
        "warning: train.report_to: swanlab not installed, so this run is not logged to it: "
        "pip install swanlab (or drop it from train.report_to); metrics.jsonl is written as always")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _train(tmp_path, "train.report_to=swanlab", "train.steps=2")
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if "swanlab" in line] == [missing_trackers_line(["swanlab"])]
    assert not [w for w in caught if "swanlab" in str(w.message)]  # a line, not a Python warning


def test_a_tracker_that_fails_to_start_is_one_error_line(tmp_path, monkeypatch, capsys):
    from corrgrpo.trainer.run_logger import TrackerStartError

    class StoreRefused(Exception):
        pass

    StoreRefused.__module__ = "mlflow.exceptions"  # as MLflow's own error is
    error = TrackerStartError.of(StoreRefused("the file store is refused\nsee the docs"), ["tensorboard", "mlflow"])
    assert str(error) == ("train.report_to: mlflow failed to start: StoreRefused: the file store is refused "
                          "(fix its settings, or drop it from train.report_to)")
    # through the command: exit status 1 and that line, no traceback
    import accelerate

    def refuse(self, *args, **kwargs):
        raise StoreRefused("the file store is refused")

    monkeypatch.setattr(accelerate.Accelerator, "init_trackers", refuse)
    out = tmp_path / "run"
    assert main(["train", "quickstart.yaml", *TOY, f"train.output_dir={out}", "train.report_to=tensorboard"]) == 1
    err = capsys.readouterr().err
    assert "error: train.report_to: tensorboard failed to start: StoreRefused: the file store is refused" in err
    assert "Traceback" not in err


# ------------------------------------------------------------------ the trackers
@pytest.mark.timeout(300)
def test_tensorboard_gets_every_scalar_and_the_config(tmp_path):
    _needs("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = _train(tmp_path, "train.report_to=tensorboard")
    (folder,) = {p.parent for p in (out / "tensorboard").rglob("events.out.tfevents.*")
                 if "hparams" not in str(p.parent) and not p.parent.name.replace(".", "").isdigit()}
    events = EventAccumulator(str(folder))
    events.Reload()
    tags = events.Tags()["scalars"]
    for key in KEYS:
        assert key in tags, sorted(tags)
        assert [e.step for e in events.Scalars(key)] == [1, 2]
    first = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert events.Scalars("reward/weighted/mean")[0].value == pytest.approx(first["reward/weighted/mean"], rel=1e-6)
    (hparams,) = (out / "tensorboard").rglob("hparams.yml")
    assert yaml.safe_load(hparams.read_text())["algorithm/estimator"] == "corrgrpo"  # however PyYAML quotes it


@pytest.mark.timeout(300)
def test_wandb_offline_gets_the_logged_keys(tmp_path, monkeypatch):
    _needs("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = _train(tmp_path, "train.report_to=wandb")
    import wandb

    # the run's finish hands its records to wandb's service process, which writes the log file
    # in its own time (seen holding only the file's header under load); teardown waits for it
    wandb.teardown()
    # wandb 0.31 keeps an offline run in its binary log (protobuf records, read by `wandb sync`);
    # no Python reader ships with it, so the test looks for the keys and the values' text there
    (log,) = (out / "wandb").glob("offline-run-*/run-*.wandb")
    data = log.read_bytes()
    last = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    for key in KEYS:
        assert data.count(key.encode()) >= 2, key  # once per logged step
        assert repr(last[key]).encode() in data or str(last[key]).encode() in data, (key, last[key])
    assert b"algorithm/estimator" in data  # the config, as the run's hyper-parameters


@pytest.mark.timeout(300)
def test_mlflow_local_store_gets_the_logged_keys(tmp_path, monkeypatch):
    _needs("mlflow")
    import mlflow

    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "mlruns").as_uri())
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3's local files (a database needs sqlalchemy)
    _train(tmp_path, "train.report_to=mlflow")
    (run,) = mlflow.search_runs(experiment_names=["corrgrpo"], output_format="list")
    assert set(KEYS) <= {k.replace("_", "/") for k in run.data.metrics} | set(run.data.metrics)


@pytest.mark.timeout(300)
def test_trackio_local_gets_the_logged_keys(tmp_path, monkeypatch):
    _needs("trackio")
    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "trackio"))
    _train(tmp_path, "train.report_to=trackio")
    assert any((tmp_path / "trackio").rglob("*")), "trackio wrote nothing locally"


@pytest.mark.timeout(300)
def test_none_writes_only_the_metrics_whose_names_form_a_tree(tmp_path):
    out = _train(tmp_path, "train.report_to=none")
    assert not (out / "tensorboard").exists() and not (out / "wandb").exists()
    # no name is both a metric and a folder of others: MLflow's file store (one file per name,
    # '/' a folder) and trackers that group by prefix cannot hold 'a/b' beside 'a/b/c'
    names = {k for r in (json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()) for k in r}
    clashes = sorted(n for n in names if any(m.startswith(n + "/") for m in names))
    assert not clashes, clashes
