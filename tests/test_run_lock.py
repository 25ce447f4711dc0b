"""One run per folder: a second process cannot train into a folder a run holds, a killed run
leaves no stale lock, and the commands say who holds it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from corrgrpo.trainer.cli import main
from corrgrpo.trainer.run_lock import LOCK_FILE, RunFolderInUse, lock_run_folder

ROOT = Path(__file__).resolve().parents[1]
TOY = [
    "env.num_tasks=16", "model.name_or_path=tiny", "algorithm.group_size=4",
    "algorithm.prompts_per_step=4", "rollout.max_new_tokens=8", "rollout.torch_threads=1",
    "train.progress=false", "train.tensorboard=false",
]


def _holder(folder: Path) -> subprocess.Popen:
    """A process that locks ``folder``, says so, and waits until it is killed."""
    code = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(ROOT)!r})
        from corrgrpo.trainer.run_lock import lock_run_folder
        lock = lock_run_folder({str(folder)!r})
        print("locked", flush=True)
        time.sleep(120)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_another_process_holding_the_folder_is_named_and_a_killed_one_leaves_no_lock(tmp_path):
    folder = tmp_path / "run"
    proc = _holder(folder)
    try:
        with pytest.raises(RunFolderInUse, match=rf"is in use by another run \(pid {proc.pid} on .* since "):
            lock_run_folder(folder)
    finally:
        proc.kill()
        proc.wait()
    # SIGKILL: the kernel dropped the lock; the file stays, naming the last holder
    assert f"pid {proc.pid}" in (folder / LOCK_FILE).read_text()
    lock = lock_run_folder(folder)
    assert lock is not None and (folder / LOCK_FILE).read_text().startswith(f"pid {__import__('os').getpid()} ")
    lock.close()


def test_one_process_may_lock_a_folder_twice_and_closing_releases_it(tmp_path):
    first = lock_run_folder(tmp_path)
    second = lock_run_folder(tmp_path)  # a second run inside one process (tests) is not stopped
    first.close()
    second.close()
    proc = _holder(tmp_path)  # released: another process can take it
    proc.kill()
    proc.wait()


def test_train_into_a_folder_another_run_holds_is_one_error_line(tmp_path, capsys):
    run = tmp_path / "run"
    proc = _holder(run)
    try:
        assert main(["train", "env_configs/quickstart.yaml", *TOY, "train.steps=1",
                     f"train.output_dir={run}"]) == 1
    finally:
        proc.kill()
        proc.wait()
    err = capsys.readouterr().err
    assert "error:" in err and "is in use by another run" in err and f"pid {proc.pid}" in err
    assert not (run / "metrics.jsonl").exists() and not (run / "config.json").exists()
    # once the holder is gone the same command trains
    assert main(["train", "env_configs/quickstart.yaml", *TOY, "train.steps=1",
                 f"train.output_dir={run}"]) == 0
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 1
