"""Aggregate memory and process caps for one sandbox, with control groups.

Resource limits (``RLIMIT_AS``, ``RLIMIT_NPROC``) bind one process or one uid;
a control group binds everything a sandbox runs at once: all its processes
together get at most ``memory.max`` bytes (the kernel's OOM killer stops the
largest inside it beyond that) and ``pids.max`` processes.

Where the host lets this process create control groups (cgroup v2 with the
``memory`` and ``pids`` controllers delegable to a child of this process's group,
or the cgroup v1 ``memory`` and ``pids`` hierarchies, typically as root), every
fresh run and every fork server gets its own group, entered by a tiny shell
wrapper before the sandbox starts and removed once it ended. Elsewhere
(:func:`cgroup_unavailable_reason` says why) the documented fallback holds: a
sandbox has its own uid with ``RLIMIT_NPROC`` (so at most ``processes``
processes) and ``RLIMIT_AS`` per process, so its total memory stays below
``processes x memory_mb``.
"""

from __future__ import annotations

import os
import shlex
import threading
import time
from pathlib import Path

from corrgrpo_envs.sandbox.base import Limits, new_token

__all__ = ["SandboxCgroup", "cgroup_unavailable_reason", "new_cgroup", "sandbox_memory_bytes"]

_ROOT = Path("/sys/fs/cgroup")
_STATE: dict[str, object] = {}
_LOCK = threading.Lock()


def sandbox_memory_bytes(limits: Limits, server: bool) -> int:
    """The cap of one sandbox: the program's memory, its tmpfs files (charged to the group) and
    the interpreter or fork server that runs it."""
    overhead_mb = 64 if server else 32
    return (int(limits.memory_mb) + 3 * int(limits.file_size_mb) + overhead_mb) << 20


class SandboxCgroup:
    """One control group (a folder per hierarchy) with a memory and a process cap."""

    def __init__(self, folders: list[Path]):
        self.folders = folders

    def enter(self) -> list[str]:
        """A command prefix that moves itself into the group, then runs the rest of the line."""
        joins = " && ".join(f"echo $$ > {shlex.quote(str(f / 'cgroup.procs'))}" for f in self.folders)
        return ["/bin/sh", "-c", f'{joins} && exec "$@"', "corrgrpo-cgroup"]

    def close(self) -> None:
        """Remove the group (waits briefly for its last processes to be gone)."""
        deadline = time.monotonic() + 5
        for folder in self.folders:
            while True:
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        break
                    _kill_members(folder)
                    time.sleep(0.01)


def _kill_members(folder: Path) -> None:
    try:
        pids = (folder / "cgroup.procs").read_text().split()
    except OSError:
        return
    for pid in pids:
        try:
            os.kill(int(pid), 9)
        except (OSError, ValueError):
            pass


def _own_paths() -> dict[str, str]:
    """This process's group per hierarchy: ``{"": v2 path, "memory": ..., "pids": ...}``."""
    out = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for name in controllers.split(",") if controllers else [""]:
            out[name] = path
    return out


def _v2_base(own: dict[str, str]) -> Path:
    if not (_ROOT / "cgroup.controllers").is_file():
        raise OSError("no cgroup v2 hierarchy at /sys/fs/cgroup")
    parent = _ROOT / own.get("", "/").lstrip("/")
    if not {"memory", "pids"} <= set((parent / "cgroup.controllers").read_text().split()):
        raise OSError(f"the memory and pids controllers are not available in {parent}")
    # A group that holds processes cannot hand controllers to children, except the root group.
    (parent / "cgroup.subtree_control").write_text("+memory +pids")
    base = parent / "corrgrpo-sandboxes"
    base.mkdir(exist_ok=True)
    (base / "cgroup.subtree_control").write_text("+memory +pids")
    return base


def _v1_bases(own: dict[str, str]) -> list[Path]:
    bases = []
    for name in ("memory", "pids"):
        hierarchy = _ROOT / name
        if name not in own or not (hierarchy / "cgroup.procs").is_file():
            raise OSError(f"no cgroup v1 {name} hierarchy")
        base = hierarchy / own[name].lstrip("/") / "corrgrpo-sandboxes"
        base.mkdir(exist_ok=True)
        bases.append(base)
    return bases


def _detect() -> tuple[str, list[Path], str]:
    """``(version, bases, reason)``: where sandbox groups go, or why nowhere."""
    try:
        own = _own_paths()
    except OSError as exc:
        return "", [], f"cannot read /proc/self/cgroup ({exc})"
    reasons = []
    try:
        return "v2", [_v2_base(own)], ""
    except OSError as exc:
        reasons.append(f"cgroup v2: {exc}")
    try:
        return "v1", _v1_bases(own), ""
    except OSError as exc:
        reasons.append(f"cgroup v1: {exc}")
    return "", [], "; ".join(reasons)


def _probe() -> tuple[str, list[Path], str]:
    with _LOCK:
        if "probe" not in _STATE:
            version, bases, reason = _detect()
            for base in bases:
                _remove_stale(base)
            if version:  # creating a group with limits must work too
                try:
                    _create(version, bases, 64 << 20, 8).close()
                except OSError as exc:
                    version, bases, reason = "", [], f"cgroup {version}: cannot create a group ({exc})"
            _STATE["probe"] = (version, bases, reason)
        return _STATE["probe"]  # type: ignore[return-value]


def _remove_stale(base: Path) -> None:
    """Empty groups left by host processes that died before removing theirs."""
    for folder in base.glob("sb-*-*"):
        try:
            os.kill(int(folder.name.split("-")[1]), 0)
        except ProcessLookupError:
            try:
                folder.rmdir()
            except OSError:
                pass
        except (OSError, ValueError):
            pass


def cgroup_unavailable_reason() -> str:
    """``""`` when sandboxes get their own control group here, else why not."""
    return _probe()[2]


def _create(version: str, bases: list[Path], memory: int, pids: int) -> SandboxCgroup:
    name = f"sb-{os.getpid()}-{new_token()[:12]}"
    caps = {  # v2 files, v1 files (each hierarchy has its own)
        "memory.max": memory, "memory.swap.max": 0, "pids.max": pids,
        "memory.limit_in_bytes": memory, "memory.memsw.limit_in_bytes": memory,
    }
    folders: list[Path] = []
    try:
        for base in bases:
            folder = base / name
            folder.mkdir()
            folders.append(folder)
            for file, value in caps.items():  # memory before memory+swap (v1 requires it)
                if (folder / file).exists():
                    (folder / file).write_text(str(value))
    except OSError:
        SandboxCgroup(folders).close()
        raise
    return SandboxCgroup(folders)


def new_cgroup(limits: Limits, server: bool) -> SandboxCgroup | None:
    """A fresh group capped for one sandbox of ``limits``; ``None`` where groups are unavailable."""
    version, bases, _ = _probe()
    if not version:
        return None
    try:
        return _create(version, bases, sandbox_memory_bytes(limits, server),
                       int(limits.processes) + 8)
    except OSError:
        return None
