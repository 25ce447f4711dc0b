"""Runs with remote envs end: every command exits non-zero within seconds of any error, with one line.

``corrgrpo train``, ``sft``, ``eval`` and ``sweep`` run as subprocesses against small fake
OpenEnv servers that are down, rename a component, send a NaN, want a token or refuse
reference answers; each run has a deadline (a hang fails the test instead of stalling it),
must exit non-zero and print exactly one ``error:`` line naming what failed, without a
traceback. A script that leaves its envs open and dies must still exit (closing an OpenEnv
client at interpreter shutdown used to start a thread there and wait on it forever).
Measured times are printed (``-s``).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("openenv", reason="the openenv extra is not installed (pip install -e '.[openenv]')")

from corrgrpo_envs.integrations.deadline_loop import CLOSE_S, GRACE_S  # noqa: E402
from corrgrpo_envs.integrations.openenv_client import TOKEN_ENV  # noqa: E402
from corrgrpo_envs.toy.env import ScaleDominanceEnv  # noqa: E402
from tests.openenv_fakes import FakeOpenEnv, free_port, observation  # noqa: E402
from tests.openenv_servers import ROOT  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
#: a failing run must be over well before this; a hang is killed here and fails the test
DEADLINE_S = 150
#: After its error line a run closes its envs (each by its close deadline, ``CLOSE_S`` plus the
#: loop thread's join) and exits; the rest is slack for a loaded 2-core machine, where the
#: interpreter's teardown alone can take seconds. A run that waits on a hung peer takes minutes.
AFTER_ERROR_S = CLOSE_S + 2 * GRACE_S + 25


def _config(tmp_path: Path, env_id: str, extra: str = "") -> Path:
    cfg = tmp_path / "remote.yaml"
    cfg.write_text(
        f"env:\n  id: {env_id}\n  num_tasks: 8\n  timeout_s: 10\n  connect_timeout_s: 5\n{extra}"
        "model:\n  name_or_path: tiny\n"
        "algorithm:\n  group_size: 2\n  prompts_per_step: 2\n"
        "rollout:\n  max_new_tokens: 4\n  torch_threads: 1\n"
        f"train:\n  steps: 2\n  split: all\n  progress: false\n  tensorboard: false\n  save_final: false\n"
        f"  output_dir: {tmp_path / 'run'}\n"
    )
    return cfg


class Run:
    """A finished command: exit code, output, wall time and how long it took to exit after its error line."""

    def __init__(self, returncode: int, output: str, seconds: float, after_error: float | None):
        self.returncode, self.output, self.seconds, self.after_error = returncode, output, seconds, after_error


def _run(argv: list[str], env: dict[str, str] | None = None) -> Run:
    """``argv`` with a deadline; each output line is timed as it arrives."""
    start = time.monotonic()
    proc = subprocess.Popen(
        argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **(env or {})},
    )
    lines: list[tuple[float, str]] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append((time.monotonic(), line))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        proc.wait(timeout=DEADLINE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        pytest.fail(f"{argv[3:5]} did not exit within {DEADLINE_S} s (a hang):\n"
                    + "".join(line for _, line in lines)[-3000:])
    ended = time.monotonic()
    reader.join(10)
    error_at = next((t for t, line in lines if line.startswith("error:")), None)
    return Run(proc.returncode, "".join(line for _, line in lines), ended - start,
               None if error_at is None else ended - error_at)


def _corrgrpo(*args: str, env: dict[str, str] | None = None) -> Run:
    return _run([sys.executable, "-m", "corrgrpo.trainer.cli", *args], env)


def _one_error(run: Run) -> str:
    """The run's one ``error:`` line (and no traceback); it exits soon after printing it."""
    errors = [line for line in run.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, run.output[-3000:]
    assert "Traceback" not in run.output, run.output[-3000:]
    assert run.after_error is not None and run.after_error < AFTER_ERROR_S, run.after_error
    return errors[0]


def _report(what: str, run: Run) -> None:
    after = "" if run.after_error is None else f", {run.after_error:.2f} s after its error line"
    print(f"{what}: exit {run.returncode} after {run.seconds:.1f} s{after}")


@pytest.fixture
def fake():
    server = FakeOpenEnv(components=["a", "b"]).start()
    yield server
    server.stop()


# ------------------------------------------------------------------ interpreter shutdown
_LEFT_OPEN = """
import sys
sys.path.insert(0, {root!r})
from corrgrpo_envs.vector import GroupedVectorEnv
venv = GroupedVectorEnv({url!r}, num_groups=2, group_size=2, workers=2, num_tasks=4)
venv.reset(task_ids=["seed-0", "seed-1"])  # four open sessions, each with its event loop
raise RuntimeError("the run failed with its envs open")
"""


def test_a_process_that_dies_with_its_envs_open_still_exits(fake):
    run = _run([sys.executable, "-c", _LEFT_OPEN.format(root=str(ROOT), url=fake.url)])
    _report("a script dying with 4 open sessions", run)
    assert run.returncode == 1 and "the run failed with its envs open" in run.output
    deadline = time.monotonic() + 30  # the process is gone: only the server thread's turn is awaited
    while fake.open_sessions:  # the OS closed the sockets: the server saw the sessions end
        assert time.monotonic() < deadline, fake.open_sessions
        time.sleep(0.05)


# ------------------------------------------------------------------ train
def test_train_against_a_server_that_is_down_is_one_line_naming_it(tmp_path):
    url = f"openenv://127.0.0.1:{free_port()}"
    run = _corrgrpo("train", str(_config(tmp_path, url)))
    _report("train, server down", run)
    line = _one_error(run)
    assert run.returncode == 1
    assert line.startswith(f"error: OpenEnv server {url.replace('openenv', 'http')}: cannot read /schema")


def test_train_stops_at_a_renamed_component_with_the_fix(fake, tmp_path):
    fake.on_step = lambda data, turn: observation(reward=1.0, done=True, reward_components={"a": 1.0, "c": 0.0})
    run = _corrgrpo("train", str(_config(tmp_path, fake.url)))
    _report("train, renamed component", run)
    line = _one_error(run)
    assert run.returncode == 1
    assert "is missing component(s) ['b'] / has unknown ['c']" in line and "set env.reward_names" in line


def test_train_stops_at_a_non_finite_reward(fake, tmp_path):
    fake.on_step = lambda data, turn: observation(reward=1.0, done=True, reward_components={"a": math.nan, "b": 1})
    run = _corrgrpo("train", str(_config(tmp_path, fake.url)))
    _report("train, NaN reward", run)
    assert run.returncode == 1 and "component 'a' is nan" in _one_error(run)


def test_train_against_a_server_that_wants_a_token_names_the_variable(fake, tmp_path):
    fake.token = "s3cret"
    run = _corrgrpo("train", str(_config(tmp_path, fake.url)), env={TOKEN_ENV: ""})
    _report("train, token missing", run)
    assert run.returncode == 1 and f"set {TOKEN_ENV}" in _one_error(run)
    run = _corrgrpo("train", str(_config(tmp_path, fake.url)), "train.steps=1", env={TOKEN_ENV: "s3cret"})
    assert run.returncode == 0, run.output[-3000:]


# ------------------------------------------------------------------ sft, eval, sweep
def test_sft_from_a_server_that_refuses_references_says_how_to_turn_them_on(fake, tmp_path):
    fake.env_name, fake.tasks, fake.reference_status = "demo", ["t1", "t2", "t3"], 403
    extra = "data:\n  source: env\n  train_split: all\n  eval_split: all\n  max_eval_examples: 1\n"
    cfg = _config(tmp_path, fake.url)
    cfg.write_text(cfg.read_text().replace("algorithm:\n  group_size: 2\n  prompts_per_step: 2\n", extra)
                   .replace("rollout:\n  max_new_tokens: 4\n  torch_threads: 1\n", "")
                   .replace("  split: all\n  progress: false\n  tensorboard: false\n  save_final: false\n", ""))
    run = _corrgrpo("sft", str(cfg))
    _report("sft, references refused", run)
    line = _one_error(run)
    assert run.returncode == 1 and "--serve-references" in line and fake.base in line


def test_eval_against_a_server_that_is_down_is_one_line(tmp_path):
    url = f"openenv://127.0.0.1:{free_port()}"
    run = _corrgrpo("eval", str(_config(tmp_path, url)), "--policy", "random", "--limit", "2")
    _report("eval, server down", run)
    assert run.returncode == 1 and "cannot read /schema" in _one_error(run)


def test_sweep_against_a_server_that_is_down_is_one_line(tmp_path):
    url = f"openenv://127.0.0.1:{free_port()}"
    run = _corrgrpo("sweep", str(_config(tmp_path, url)), "--weights", "simplex:1", "--seeds", "1",
                              "--out", str(tmp_path / "sweep"))
    _report("sweep, server down", run)
    assert run.returncode == 1 and "cannot read /schema" in _one_error(run)


class InfiniteMetricsEnv(ScaleDominanceEnv):
    """The toy env with a broken metric (as a float32 overflow once made them)."""

    def metrics(self, records):
        return {**super().metrics(records), "total": math.inf}


@pytest.mark.timeout(120)
def test_eval_refuses_non_finite_metrics_and_writes_nothing(tmp_path, capsys):
    from corrgrpo.trainer.cli import main

    cfg = tmp_path / "inf.yaml"
    cfg.write_text(f"env:\n  id: {__name__}:InfiniteMetricsEnv\n  num_tasks: 8\nmodel:\n  name_or_path: tiny\n")
    out = tmp_path / "eval.json"
    assert main(["eval", str(cfg), "--policy", "reference", "--split", "all", "--limit", "2",
                 "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "error: non-finite value(s) in the evaluation of" in err and "metrics/total = inf" in err
    assert "nothing written" in err
    assert not out.exists()
    assert json.dumps({"x": 1.0}, allow_nan=False)  # what the written file uses
