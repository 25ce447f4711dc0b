"""Checkpoints: atomic writes, skipping torn ones, weights_only loading, and the run's metrics file."""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from corrgrpo.trainer.checkpoint import (
    MANIFEST,
    CheckpointError,
    checkpoint_problem,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from corrgrpo.trainer.run_logger import RunLogger, read_metrics

ROOT = Path(__file__).resolve().parents[1]


class TinyModel(torch.nn.Module):
    """A model with the two methods checkpoints use: ``save_pretrained`` and ``load_state_dict``."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, x):
        return self.linear(x)

    def save_pretrained(self, folder, safe_serialization=True, state_dict=None):
        Path(folder).mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in (state_dict or self.state_dict()).items()},
                  str(Path(folder) / "model.safetensors"))


class TinyTokenizer:
    def save_pretrained(self, folder):
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / "tokenizer.json").write_text('{"vocab": {}}', encoding="utf-8")


def _training_state(steps: int = 3):
    torch.manual_seed(0)
    model = TinyModel()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    for _ in range(steps):
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
        sched.step()
    return model, opt, sched


def _save(path: Path, step: int, model, opt, sched, **kw) -> Path:
    return save_checkpoint(path, step=step, model=model, tokenizer=TinyTokenizer(), optimizer=opt,
                           scheduler=sched, config={"path": Path("/x"), "seed": 1}, **kw)


def _draws() -> tuple:
    return random.random(), float(np.random.rand()), float(np.random.randn()), torch.rand(3).tolist()


def test_round_trip_restores_weights_optimizer_scheduler_and_rng(tmp_path):
    model, opt, sched = _training_state()
    random.seed(3)
    np.random.seed(4)
    np.random.randn()  # leaves a cached gaussian in numpy's legacy state
    torch.manual_seed(5)
    ckpt = _save(tmp_path / "checkpoint-3", 3, model, opt, sched)
    want = _draws()
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    opt_state = opt.state_dict()

    model2, opt2, sched2 = _training_state(steps=1)
    random.seed(99)
    np.random.seed(99)
    torch.manual_seed(99)
    state = load_checkpoint(ckpt, model2, opt2, sched2)
    assert state["step"] == 3 and state["config"] == {"path": "/x", "seed": 1}
    assert _draws() == want
    for k, v in weights.items():
        torch.testing.assert_close(model2.state_dict()[k], v)
    got = opt2.state_dict()
    for i, s in opt_state["state"].items():
        for key, value in s.items():
            torch.testing.assert_close(got["state"][i][key], value)
    assert sched2.state_dict()["last_epoch"] == sched.state_dict()["last_epoch"] == 3
    assert sched2.get_last_lr() == sched.get_last_lr()
    # every .pt file loads under weights_only=True
    for f in ("trainer_state.pt", "rng_0.pt"):
        torch.load(ckpt / f, weights_only=True)


def test_save_writes_in_place_atomically_with_a_manifest(tmp_path):
    model, opt, sched = _training_state()
    ckpt = _save(tmp_path / "checkpoint-1", 1, model, opt, sched)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-1"]  # no temporary folder left
    manifest = json.loads((ckpt / MANIFEST).read_text())
    assert manifest["step"] == 1
    assert set(manifest["files"]) == {"model/model.safetensors", "model/tokenizer.json",
                                      "trainer_state.pt", "rng_0.pt"}
    assert all(manifest["files"][f] == (ckpt / f).stat().st_size for f in manifest["files"])
    assert checkpoint_problem(ckpt) is None
    # saving the same step again replaces the folder
    (ckpt / "stale.txt").write_text("x")
    _save(tmp_path / "checkpoint-1", 1, model, opt, sched)
    assert not (ckpt / "stale.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-1"]
    with pytest.raises(ValueError, match="barrier"):
        _save(tmp_path / "checkpoint-2", 2, model, opt, sched, rank=1, is_main=False)


def _tear(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize(
    "damage, problem",
    [
        (lambda c: _tear(c / "trainer_state.pt"), "trainer_state.pt has"),
        (lambda c: _tear(c / "model" / "model.safetensors"), "model/model.safetensors has"),
        (lambda c: (c / "rng_0.pt").unlink(), "rng_0.pt is missing"),
        (lambda c: (c / MANIFEST).write_text("{not json"), "checkpoint.json is unreadable"),
        # written by a writer without a manifest (an older version): the files themselves are checked
        (lambda c: ((c / MANIFEST).unlink(), _tear(c / "trainer_state.pt")), "trainer_state.pt is not a complete"),
        (lambda c: ((c / MANIFEST).unlink(), _tear(c / "model" / "model.safetensors")), "model/model.safetensors:"),
    ],
)
def test_latest_checkpoint_skips_a_damaged_one_and_falls_back(tmp_path, caplog, damage, problem):
    model, opt, sched = _training_state()
    first = _save(tmp_path / "checkpoint-1", 1, model, opt, sched)
    second = _save(tmp_path / "checkpoint-2", 2, model, opt, sched)
    (tmp_path / "checkpoint-3").mkdir()  # an empty folder, e.g. made by hand
    damage(second)
    assert problem in checkpoint_problem(second)
    with caplog.at_level(logging.WARNING, logger="corrgrpo.trainer.checkpoint"):
        assert latest_checkpoint(tmp_path) == first
    text = caplog.text
    assert "skipping checkpoint" in text and str(second) in text and str(tmp_path / "checkpoint-3") in text
    with pytest.raises(CheckpointError, match="incomplete or corrupt"):
        load_checkpoint(second, *_training_state(1))
    assert load_checkpoint(first, *_training_state(1))["step"] == 1


def test_a_legacy_checkpoint_without_manifest_still_loads(tmp_path):
    model, opt, sched = _training_state()
    ckpt = _save(tmp_path / "checkpoint-4", 4, model, opt, sched)
    (ckpt / MANIFEST).unlink()
    assert latest_checkpoint(tmp_path) == ckpt
    assert load_checkpoint(ckpt, *_training_state(1))["step"] == 4


def test_an_rng_file_of_the_earlier_layout_still_restores(tmp_path):
    model, opt, sched = _training_state()
    ckpt = _save(tmp_path / "checkpoint-1", 1, model, opt, sched)
    (ckpt / MANIFEST).unlink()
    random.seed(11)
    np.random.seed(12)
    torch.manual_seed(13)
    # the earlier layout: the state tuples as the libraries return them (a numpy array inside)
    torch.save({"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
                "cuda": None}, ckpt / "rng_0.pt")
    want = _draws()
    random.seed(0)
    np.random.seed(0)
    load_checkpoint(ckpt, *_training_state(1))
    assert _draws() == want


class _Payload:
    """Pickles as a call that creates a file: what a crafted checkpoint would run on load."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (str(self.marker),))


@pytest.mark.parametrize("target", ["trainer_state.pt", "rng_0.pt"])
def test_crafted_pickles_do_not_run(tmp_path, target):
    model, opt, sched = _training_state()
    ckpt = _save(tmp_path / "checkpoint-1", 1, model, opt, sched)
    (ckpt / MANIFEST).unlink()  # as if crafted wholesale
    marker = tmp_path / "code-ran"
    real = torch.load(ckpt / target, weights_only=True)
    torch.save({**real, "payload": _Payload(marker)}, ckpt / target)
    assert latest_checkpoint(tmp_path) == ckpt  # checking a folder unpickles nothing
    with pytest.raises(CheckpointError, match="weights_only=True"):
        load_checkpoint(ckpt, *_training_state(1))
    assert not marker.exists()


_KILLED_WRITER = r"""
import sys, time
from pathlib import Path
# python -c: the working directory (the checkout) is on sys.path
from tests.test_checkpoint import TinyTokenizer, _save, _training_state

run = Path(sys.argv[1])
model, opt, sched = _training_state()
_save(run / "checkpoint-1", 1, model, opt, sched)

class SlowTokenizer(TinyTokenizer):
    def save_pretrained(self, folder):
        Path(folder).mkdir(parents=True, exist_ok=True)
        with open(Path(folder) / "tokenizer.json", "w") as f:
            f.write('{"vocab": {"a"')  # half a file ...
            f.flush()
            (run / "writing").write_text("now")
            time.sleep(120)  # ... and the process is killed here

from corrgrpo.trainer.checkpoint import save_checkpoint
save_checkpoint(run / "checkpoint-2", step=2, model=model, tokenizer=SlowTokenizer(),
                optimizer=opt, scheduler=sched)
"""


def test_sigkill_during_a_save_leaves_the_previous_checkpoint_to_resume(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_WRITER, str(run)], cwd=ROOT)
    try:
        deadline = time.monotonic() + 120
        while not (run / "writing").exists():
            assert proc.poll() is None, "the writer exited before it began checkpoint-2"
            assert time.monotonic() < deadline, "the writer never began checkpoint-2"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not (run / "checkpoint-2").exists()  # the torn save never got its final name
    assert (run / ".checkpoint-2.partial" / "model" / "tokenizer.json").exists()
    assert latest_checkpoint(run) == run / "checkpoint-1"
    assert load_checkpoint(run / "checkpoint-1", *_training_state(1))["step"] == 1
    # the next save of that step clears the leftover
    _save(run / "checkpoint-2", 2, *_training_state())
    assert latest_checkpoint(run) == run / "checkpoint-2"
    assert not (run / ".checkpoint-2.partial").exists()


# ------------------------------------------------------------------ metrics.jsonl
def _write(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")


def test_read_metrics_drops_a_torn_last_line_with_a_warning(tmp_path, caplog):
    _write(tmp_path / "metrics.jsonl", '{"step": 1}\n{"step": 2}\n{"step": 3, "loss": 0.')
    with caplog.at_level(logging.WARNING, logger="corrgrpo.trainer.run_logger"):
        assert read_metrics(tmp_path) == [{"step": 1}, {"step": 2}]
    assert "torn last line 3" in caplog.text and "metrics.jsonl" in caplog.text


def test_a_bad_line_in_the_middle_names_the_file_and_line(tmp_path):
    _write(tmp_path / "metrics.jsonl", '{"step": 1}\n{"step": 2\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"metrics\.jsonl:2: not a JSON object record"):
        read_metrics(tmp_path)


def test_resume_truncates_and_repairs_a_torn_file(tmp_path):
    _write(tmp_path / "metrics.jsonl", '{"step": 1}\n{"step": 2}\n{"step": 3}\n{"step": 4, "lo')
    logger = RunLogger(tmp_path)
    logger.truncate_after(2)
    logger.log({"step": 3, "x": 1.0})
    assert read_metrics(tmp_path) == [{"step": 1}, {"step": 2}, {"step": 3, "x": 1.0}]
    assert (tmp_path / "metrics.jsonl").read_text().endswith("\n")


def test_resume_drops_the_samples_of_steps_after_the_checkpoint(tmp_path):
    _write(tmp_path / "metrics.jsonl", '{"step": 1}\n{"step": 2}\n')
    _write(tmp_path / "samples.jsonl", '{"step": 1, "text": "a"}\n{"step": 2, "text": "b"}\n{"step": 3, "text": "lost"}\n')
    logger = RunLogger(tmp_path)
    logger.truncate_after(2)
    logger.log_samples(3, [{"text": "again"}])
    texts = [json.loads(line)["text"] for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert texts == ["a", "b", "again"]


def test_a_torn_file_is_repaired_before_appending(tmp_path):
    _write(tmp_path / "metrics.jsonl", '{"step": 1}\n{"step": 2, "lo')
    logger = RunLogger(tmp_path)
    logger.log({"step": 2})
    assert read_metrics(tmp_path) == [{"step": 1}, {"step": 2}]


def test_a_fresh_start_in_an_old_folder_moves_the_old_logs_aside(tmp_path, caplog):
    _write(tmp_path / "metrics.jsonl", "".join(json.dumps({"step": s}) + "\n" for s in (1, 2, 3)))
    _write(tmp_path / "samples.jsonl", '{"step": 1, "text": "old"}\n')
    logger = RunLogger(tmp_path)
    with caplog.at_level(logging.WARNING, logger="corrgrpo.trainer.run_logger"):
        logger.log({"step": 1})
        logger.log_samples(1, [{"text": "new"}])
        logger.log({"step": 2})
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]
    old = sorted(p.name for p in tmp_path.glob("*.old-*"))
    assert [n.split(".old-")[0] for n in old] == ["metrics.jsonl", "samples.jsonl"]
    assert [r["step"] for r in read_metrics_file(tmp_path / old[0])] == [1, 2, 3]
    assert "moved them aside" in caplog.text and old[0] in caplog.text
    assert (tmp_path / "samples.jsonl").read_text().count("\n") == 1


def read_metrics_file(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_continuing_after_the_last_step_appends(tmp_path):
    _write(tmp_path / "metrics.jsonl", '{"step": 1}\n{"step": 2}\n')
    logger = RunLogger(tmp_path)
    logger.truncate_after(2)
    logger.log({"step": 3})
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3]
    assert not list(tmp_path.glob("*.old-*"))


def test_logger_sends_each_records_finite_numbers_to_the_trackers(tmp_path):
    sent = []
    logger = RunLogger(tmp_path, send=lambda values, step: sent.append((step, values)))
    logger.log({"step": 1, "loss": 0.5, "c_q/median": float("nan"), "done": True, "name": "x", "n": 3})
    assert sent == [(1, {"loss": 0.5, "n": 3.0})]  # no step, NaN, bool or text: what a tracker plots
    assert read_metrics(tmp_path) == [{"step": 1, "loss": 0.5, "c_q/median": None, "done": True, "name": "x", "n": 3}]
