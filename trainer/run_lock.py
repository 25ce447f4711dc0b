"""One run per folder: a run holds an exclusive lock on ``<output_dir>/.run.lock`` while it runs.

Two runs writing one folder (a job started twice, a second ``train.resume=auto`` beside the
first) would interleave their ``metrics.jsonl`` lines, move each other's logs aside and
overwrite each other's checkpoints. The lock is a POSIX record lock (``fcntl.lockf``): the
kernel drops it when the process ends, however it ends, so a killed run never leaves a stale
lock behind; the file itself stays and says who held it last. Only another *process* conflicts
(a second run inside one process, as tests do, is not stopped). Where ``fcntl`` does not exist
(Windows), runs are not locked.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import IO

__all__ = ["LOCK_FILE", "RunFolderInUse", "lock_run_folder"]

LOCK_FILE = ".run.lock"


class RunFolderInUse(RuntimeError):
    """Another process is running in this folder."""


def lock_run_folder(folder: str | Path) -> IO[str] | None:
    """Lock ``folder`` for this process; returns the open lock file (closing it releases the lock).

    Raises :class:`RunFolderInUse`, naming the holder (pid, host, start time), when another process
    holds it.
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        return None
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    f = open(folder / LOCK_FILE, "a+", encoding="utf-8")
    try:
        fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.seek(0)
        holder = f.read().strip() or "another process"
        f.close()
        raise RunFolderInUse(
            f"{folder} is in use by another run ({holder}); wait for it to end or stop it, "
            "or set train.output_dir to another folder"
        ) from None
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}\n")
    f.flush()
    return f
