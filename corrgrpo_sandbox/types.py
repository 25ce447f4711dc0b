"""The sandbox's plain types: limits, results, warnings and errors, shared constants.

A leaf module: it imports no other module of :mod:`corrgrpo_sandbox`, so every backend, the
fork server, the seccomp filter and the control groups can take their types from here without
an import cycle.
"""

from __future__ import annotations

import secrets
import signal
from dataclasses import dataclass, field

__all__ = ["MINIMAL_ENV", "SANDBOX_CWD", "Limits", "RunResult", "SandboxDowngrade", "decided_status",
           "SandboxUnavailable", "new_token", "signal_name"]

#: The whole environment a sandboxed program sees (no variable of the parent leaks).
MINIMAL_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/tmp"}

#: Where programs run inside sandboxes that give them a private /tmp.
SANDBOX_CWD = "/tmp/work"


class SandboxUnavailable(RuntimeError):
    """The backend cannot run on this machine (missing tool, no permission, no engine)."""


@dataclass(frozen=True)
class Limits:
    """Resource limits of one program.

    Args:
        timeout: wall-clock seconds before the whole process group is killed.
        cpu_seconds: CPU-time limit (``RLIMIT_CPU``); default ``ceil(timeout) + 1``.
        memory_mb: address-space limit (``RLIMIT_AS``).
        file_size_mb: largest file the program may write (``RLIMIT_FSIZE``), and
            the size of its private /tmp.
        open_files: ``RLIMIT_NOFILE``.
        processes: ``RLIMIT_NPROC`` (counted per user where the kernel honours it).
        output_bytes: stdout and stderr are each captured up to this size; a
            program that prints more is killed (status ``output_limit``).
    """

    timeout: float = 5.0
    cpu_seconds: int | None = None
    memory_mb: int = 1024
    file_size_mb: int = 16
    open_files: int = 64
    processes: int = 64
    output_bytes: int = 1 << 20

    def __post_init__(self) -> None:
        if not self.timeout > 0:
            raise ValueError(f"timeout must be > 0, got {self.timeout}")
        for name in ("memory_mb", "file_size_mb", "open_files", "processes", "output_bytes"):
            if int(getattr(self, name)) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")

    def rlimits(self) -> dict[str, int]:
        """The ``resource`` limits the runner applies, by name."""
        cpu = self.cpu_seconds if self.cpu_seconds is not None else int(self.timeout) + 1
        return {
            "RLIMIT_CPU": int(cpu),
            "RLIMIT_AS": int(self.memory_mb) << 20,
            "RLIMIT_FSIZE": int(self.file_size_mb) << 20,
            "RLIMIT_NOFILE": int(self.open_files),
            "RLIMIT_NPROC": int(self.processes),
            "RLIMIT_CORE": 0,
        }


@dataclass
class RunResult:
    """The outcome of one program.

    ``status`` is one of: ``ok`` (ran to the end), ``assertion`` (stopped at a
    failed ``assert``), ``error:<ExceptionName>``, ``memory`` (``MemoryError``),
    ``syntax`` (did not compile), ``timeout``, ``output_limit``, ``killed`` (died
    without reporting, e.g. by a signal or ``os._exit``) or ``sandbox_error``.
    ``exec_seconds`` is the time the runner measured inside the program (the
    program can change it: informational only); ``cpu_seconds`` is the CPU time
    (user + system) of every process the program started, as the kernel counted
    it in the control group the program runs in (read outside the program),
    ``None`` where no such group is possible here or the backend cannot read it;
    ``wall_seconds`` is the host's view of the whole run. ``channel`` is the raw
    text of the status channel (the runner's status line and, for programs that
    ask for calls, one record per call: :mod:`corrgrpo_sandbox.calls`).
    """

    status: str
    stdout: str = ""
    stderr: str = ""
    exec_seconds: float = 0.0
    wall_seconds: float = 0.0
    returncode: int | None = None
    backend: str = ""
    extra: dict = field(default_factory=dict)
    cpu_seconds: float | None = None
    channel: str = ""

    @property
    def passed(self) -> bool:
        """Every statement ran and no assertion failed."""
        return self.status == "ok"

    @property
    def finished(self) -> bool:
        """Ran to the end or stopped at a failed assertion (the ``runtime`` reward)."""
        return self.status in ("ok", "assertion")


class SandboxDowngrade(UserWarning):
    """A sandbox runs with weaker isolation than the one asked for (the message says why)."""


def new_token() -> str:
    """A one-time random hex name: the token that tags a run's status lines, a control
    group's name."""
    return secrets.token_hex(16)


def decided_status(reported: str | None, over: str | None, returncode: int | None) -> str:
    """A run's status as the host decides it: a bound the host enforced (``over``: ``timeout``
    or ``output``) first, else what the program's channel reported, else how it died."""
    if over == "timeout":
        return "timeout"
    if over == "output":
        return "output_limit"
    if reported is not None:
        return reported
    if returncode is not None and returncode < 0:
        return f"killed:{signal_name(-returncode)}"
    return "killed"


def signal_name(number: int) -> str:
    """``SIGKILL`` for 9; real-time signals, which have no name of their own, as ``SIGRTMIN+k``
    (a program may die of any signal it sends itself or asks the kernel to send it)."""
    try:
        return signal.Signals(number).name
    except ValueError:
        low = getattr(signal, "SIGRTMIN", 0)
        if low and low <= number <= getattr(signal, "SIGRTMAX", 0):
            return f"SIGRTMIN+{number - low}"
        return f"SIG{number}"
