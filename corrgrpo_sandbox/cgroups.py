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

from corrgrpo_sandbox.types import Limits, new_token

__all__ = ["CpuGroup", "SandboxCgroup", "cgroup_unavailable_reason", "cpu_accounting",
           "cpu_unavailable_reason", "new_cgroup", "sandbox_memory_bytes"]

#: Where a fork server sees its sandbox's CPU group (bound there, writable); its programs run
#: in the sub-group :data:`PROGRAM_GROUP` of it.
SERVER_CPU_MOUNT = "/sys/fs/cgroup"

#: Which hierarchies may count CPU time, in order of preference.
CPU_HIERARCHIES = ("v2", "v1")
PROGRAM_GROUP = "program"

_ROOT = Path("/sys/fs/cgroup")
_STATE: dict[str, object] = {}
_LOCK = threading.Lock()


def sandbox_memory_bytes(limits: Limits, server: bool) -> int:
    """The cap of one sandbox: the program's memory, its tmpfs files (charged to the group) and
    the interpreter or fork server that runs it."""
    overhead_mb = 64 if server else 32
    return (int(limits.memory_mb) + 3 * int(limits.file_size_mb) + overhead_mb) << 20


class CpuGroup:
    """The folder of a control group that counts the CPU time of everything in it.

    cgroup v2: ``usage_usec`` of ``cpu.stat`` (every v2 group has it, with or without the cpu
    controller); cgroup v1: ``cpuacct.usage`` (nanoseconds). A process cannot leave its group
    without write access to the group files, and every descendant starts in its parent's
    group, so the count covers children that are reaped automatically, daemons and threads.
    """

    def __init__(self, folder: Path, version: str):
        self.folder = folder
        self.version = version

    @property
    def usage_file(self) -> str:
        """The file with the group's CPU time (``cpu.stat`` or ``cpuacct.usage``)."""
        return "cpu.stat" if self.version == "v2" else "cpuacct.usage"

    def nanoseconds(self) -> int:
        """CPU time (user + system) of everything that ever ran in the group, in nanoseconds."""
        return read_cpu_ns(self.folder / self.usage_file)


def read_cpu_ns(path: Path) -> int:
    """The CPU time in a ``cpu.stat`` (``usage_usec``) or ``cpuacct.usage`` file, in ns."""
    text = path.read_text()
    if path.name == "cpuacct.usage":
        return int(text.strip())
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == "usage_usec":
            return int(value) * 1000
    raise OSError(f"no usage_usec in {path}")


class SandboxCgroup:
    """One control group (a folder per hierarchy) with a memory and a process cap, and the group
    that counts its CPU time (:attr:`cpu`, ``None`` where no hierarchy can)."""

    def __init__(self, folders: list[Path], cpu: CpuGroup | None = None):
        self.folders = folders
        self.cpu = cpu

    def program_group(self, owner: int | None) -> CpuGroup | None:
        """A sub-group of :attr:`cpu` for the programs of a fork server, which moves each child
        there itself; ``owner`` (the host uid the server runs as, ``None`` for root) gets
        write access to the files that takes. ``None`` without a CPU group."""
        if self.cpu is None:
            return None
        folder = self.cpu.folder / PROGRAM_GROUP
        try:
            folder.mkdir(exist_ok=True)
            if owner is not None:
                for path in (self.cpu.folder, self.cpu.folder / "cgroup.procs", folder,
                             folder / "cgroup.procs"):
                    os.chown(path, owner, owner)
        except OSError:
            return None
        return CpuGroup(folder, self.cpu.version)

    def cpu_seconds(self) -> float | None:
        """The CPU time of everything that ran in the group, once nothing runs there any more
        (the rest is killed); ``None`` without a CPU group."""
        if self.cpu is None:
            return None
        deadline = time.monotonic() + 5
        while _members(self.cpu.folder) and time.monotonic() < deadline:
            _kill_members(self.cpu.folder)
            time.sleep(0.001)
        try:
            return self.cpu.nanoseconds() / 1e9
        except (OSError, ValueError):
            return None

    def enter(self) -> list[str]:
        """A command prefix that moves itself into the group, then runs the rest of the line."""
        joins = " && ".join(f"echo $$ > {shlex.quote(str(f / 'cgroup.procs'))}" for f in self.folders)
        return ["/bin/sh", "-c", f'{joins} && exec "$@"', "corrgrpo-cgroup"]

    def close(self) -> None:
        """Remove the group (waits briefly for its last processes to be gone)."""
        deadline = time.monotonic() + 5
        subgroups = [self.cpu.folder / PROGRAM_GROUP] if self.cpu is not None else []
        for folder in [*subgroups, *self.folders]:
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


def _members(folder: Path) -> list[str]:
    found = []
    for group in [folder, *(p for p in folder.iterdir() if p.is_dir())]:
        try:
            found += (group / "cgroup.procs").read_text().split()
        except OSError:
            pass
    return found


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


def _mounts() -> list[tuple[str, str, list[str]]]:
    """``(mount point, type, super options)`` of every cgroup file system."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, rest = left.split(), right.split()
        if len(rest) >= 3 and rest[0] in ("cgroup", "cgroup2"):
            out.append((fields[4], rest[0], rest[2].split(",")))
    return out


def _cpu_bases(own: dict[str, str]) -> tuple[str, Path, str]:
    """``(version, base, reason)`` of the hierarchy that counts CPU time: cgroup v2 first (a
    unified hierarchy, even one without controllers: every v2 group has ``cpu.stat``), else the
    v1 ``cpuacct`` one."""
    reasons = []
    try:
        mounts = _mounts()
    except OSError as exc:
        return "", Path(), f"cannot read /proc/self/mountinfo ({exc})"
    found = {"v2": [m for m in mounts if m[1] == "cgroup2"],
             "v1": [m for m in mounts if m[1] == "cgroup" and "cpuacct" in m[2]]}
    for point, kind, _ in [m for version in CPU_HIERARCHIES for m in found[version]]:
        version = "v2" if kind == "cgroup2" else "v1"
        path = own.get("" if version == "v2" else "cpuacct", "/")
        base = Path(point) / path.lstrip("/") / "corrgrpo-cpu"
        try:
            base.mkdir(exist_ok=True)
            probe = CpuGroup(base, version)
            probe.nanoseconds()
            return version, base, ""
        except OSError as exc:
            reasons.append(f"{kind} at {point}: {exc}")
    return "", Path(), "; ".join(reasons) or "no cgroup2 or cgroup v1 cpuacct hierarchy is mounted"


def _cpu_probe() -> tuple[str, Path, str]:
    with _LOCK:
        if "cpu" not in _STATE:
            try:
                version, base, reason = _cpu_bases(_own_paths())
            except OSError as exc:
                version, base, reason = "", Path(), f"cannot read /proc/self/cgroup ({exc})"
            if version:
                _remove_stale(base)
                try:
                    folder = base / f"sb-{os.getpid()}-{new_token()[:12]}"
                    folder.mkdir()
                    folder.rmdir()
                except OSError as exc:
                    version, reason = "", f"cgroup {version}: cannot create a group ({exc})"
            _STATE["cpu"] = (version, base, reason)
        return _STATE["cpu"]  # type: ignore[return-value]


def cpu_unavailable_reason() -> str:
    """``""`` when every sandbox gets a group that counts its CPU time here, else why not (then
    ``cpu_seconds`` is ``None`` and the code env reports efficiency as unavailable)."""
    return "" if _probe()[0] == "v2" else _cpu_probe()[2]


def cpu_accounting() -> str:
    """``"cgroup-v2"``, ``"cgroup-v1"`` or ``""``: what counts a sandbox's CPU time here."""
    version = "v2" if _probe()[0] == "v2" else _cpu_probe()[0]
    return f"cgroup-{version}" if version else ""


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
            for group in (folder / PROGRAM_GROUP, folder):
                try:
                    group.rmdir()
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
    """A fresh group capped for one sandbox of ``limits`` and counting its CPU time; ``None``
    where neither caps nor CPU groups are available (each part is ``None``/empty on its own
    where only it is unavailable)."""
    version, bases, _ = _probe()
    group = None
    if version:
        try:
            group = _create(version, bases, sandbox_memory_bytes(limits, server),
                            int(limits.processes) + 8)
        except OSError:
            group = None
    if group is not None and version == "v2":  # one v2 group per process: that one counts too
        group.cpu = CpuGroup(group.folders[0], "v2")
        return group
    cpu_version, cpu_base, _ = _cpu_probe()
    if not cpu_version:
        return group
    group = group or SandboxCgroup([])
    folder = cpu_base / f"sb-{os.getpid()}-{new_token()[:12]}"
    try:
        folder.mkdir()
    except OSError:
        return group if group.folders else None
    group.folders.append(folder)
    group.cpu = CpuGroup(folder, cpu_version)
    return group
