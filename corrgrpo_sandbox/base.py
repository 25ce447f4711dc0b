"""The sandbox interface: run one untrusted Python program under limits.

Every backend starts a fresh interpreter per program (``python -I -S``), feeds
it the program through :data:`~corrgrpo_sandbox.runner.RUNNER_SOURCE`, and
returns a :class:`RunResult`. Backends differ in how they isolate that
interpreter (namespaces, bubblewrap, containers); this module holds what they
share: the host side of one run (feeding stdin,
draining output with a size cap, the wall timeout that kills the whole process
group).
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import time
from abc import ABC, abstractmethod

from corrgrpo_sandbox.calls import channel_text
from corrgrpo_sandbox.runner import RUNNER_SOURCE
from corrgrpo_sandbox.seccomp import program_filter, syscall_numbers
from corrgrpo_sandbox.types import MINIMAL_ENV, Limits, RunResult, decided_status

__all__ = ["Sandbox", "append_capped", "runner_command"]

class Sandbox(ABC):
    """Runs untrusted Python programs, one fresh interpreter each.

    Subclasses implement :meth:`run`. Instances are safe to share between
    threads: every call starts its own process.
    """

    name: str = "abstract"
    #: Whether fresh runs get ``cpu_seconds`` (from a control group per run, where this host
    #: can make one: :func:`~corrgrpo_sandbox.cgroups.cpu_accounting`).
    fresh_cpu_visible: bool = True
    #: Whether programs run under the seccomp filter (:mod:`corrgrpo_sandbox.seccomp`);
    #: turn it off on an instance only to test the other layers.
    seccomp: bool = True

    def __init__(self, limits: Limits | None = None, python: str | None = None,
                 paths: list[str] | None = None, hide: list[str] | None = None):
        self.limits = limits or Limits()
        self.python = python or sys.executable
        #: folders appended to ``sys.path`` in the sandbox (e.g. for ``sortedcontainers``).
        self.paths = list(paths or [])
        #: host files and folders programs must not read even inside an allowed folder (data
        #: sets, reference caches): covered in the process and bwrap views
        #: (:mod:`corrgrpo_sandbox.view`); a container holds no host file to begin with.
        self.hide = [str(p) for p in (hide or [])]

    @abstractmethod
    def run(self, program: str, limits: Limits | None = None) -> RunResult:
        """Run ``program`` (Python source) and report how it ended."""

    def close(self) -> None:
        """Release what the backend holds (containers); a no-op for process backends."""
        return None

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(limits={self.limits})"

    # ------------------------------------------------------------ helpers
    def _header(self, token: str, limits: Limits, **extra: object) -> dict:
        header = {"token": token, "rlimits": limits.rlimits(), "paths": self.paths,
                  "syscalls": syscall_numbers(), "seccomp": program_filter() if self.seccomp else None}
        header.update(extra)
        return header

    def _run_command(self, command: list[str], header: dict, program: str, limits: Limits,
                     cwd: str = "/", status_pipe: bool = True) -> RunResult:
        """Start ``command`` (which ends in the runner), feed it, drain it, classify it."""
        token = header["token"]
        status_r = status_w = None
        pass_fds: tuple[int, ...] = ()
        if status_pipe:
            status_r, status_w = os.pipe()
            header = {**header, "status_fd": status_w}
            pass_fds = (status_w,)
        payload = repr(header).encode() + b"\n" + program.encode("utf-8", "replace")
        start = time.perf_counter()
        try:
            proc = subprocess.Popen(
                command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                env=dict(MINIMAL_ENV), cwd=cwd, pass_fds=pass_fds, start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            for fd in (status_r, status_w):
                if fd is not None:
                    os.close(fd)
            return RunResult("sandbox_error", stderr=str(exc), backend=self.name)
        if status_w is not None:
            os.close(status_w)
        try:
            outputs, status_text, over = _drain(proc, payload, status_r, limits, start)
        finally:
            if status_r is not None:
                os.close(status_r)
            _kill_group(proc)
        wall = time.perf_counter() - start
        stdout = outputs[0].decode("utf-8", "replace")
        stderr = outputs[1].decode("utf-8", "replace")
        if not status_pipe:
            status_text, stderr = _split_status_from_stderr(stderr, token)
        status, exec_seconds = _parse_status(status_text, token)
        status = decided_status(status, over, proc.returncode)
        # (``cpu_seconds`` comes from the run's control group, read by the backend: the rusage
        # of the process started here misses descendants that were reaped automatically)
        return RunResult(status, stdout, stderr, exec_seconds, wall, proc.returncode, self.name,
                         channel=channel_text(status_text, token))


def append_capped(
    chunks: list[list[bytes]], sizes: list[int], idx: int, data: bytes, cap: int
) -> bool:
    """Keep at most ``cap`` bytes of stream ``idx``; True when it went past them.

    ``sizes`` counts every byte read (kept or not), so the overflow is known even
    though only the first ``cap`` bytes are stored. The status channel (``idx``
    2) counts too: it carries the values of called functions.
    """
    if sizes[idx] < cap:
        chunks[idx].append(data[: cap - sizes[idx]])
    sizes[idx] += len(data)
    return sizes[idx] > cap


def _drain(proc: subprocess.Popen, payload: bytes, status_fd: int | None, limits: Limits,
           start: float) -> tuple[list[bytes], str, str | None]:
    """Feed stdin, collect stdout/stderr/status until exit, timeout or too much output."""
    sel = selectors.DefaultSelector()
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    os.set_blocking(proc.stdin.fileno(), False)
    sel.register(proc.stdin, selectors.EVENT_WRITE, "in")
    sel.register(proc.stdout, selectors.EVENT_READ, 0)
    sel.register(proc.stderr, selectors.EVENT_READ, 1)
    if status_fd is not None:
        sel.register(status_fd, selectors.EVENT_READ, 2)
    chunks: list[list[bytes]] = [[], [], []]
    sizes = [0, 0, 0]
    sent = 0
    deadline = start + limits.timeout
    exited_at: float | None = None
    over: str | None = None
    try:
        while sel.get_map():
            now = time.perf_counter()
            if now >= deadline:
                over = "timeout"
                break
            if exited_at is None and _reap(proc, block=False):
                exited_at = now
            # A child left behind may hold the pipes open: stop shortly after the main process.
            if exited_at is not None and now - exited_at > 0.2:
                break
            wait = min(deadline - now, 0.05 if exited_at is not None else 0.25)
            for key, _ in sel.select(timeout=wait):
                if key.data == "in":
                    try:
                        sent += os.write(key.fd, payload[sent : sent + 65536])
                    except (BrokenPipeError, BlockingIOError, OSError):
                        sent = len(payload)
                    if sent >= len(payload):
                        sel.unregister(key.fileobj)
                        proc.stdin.close()
                    continue
                data = os.read(key.fd, 65536)
                if not data:
                    sel.unregister(key.fileobj)
                    continue
                idx = key.data
                if append_capped(chunks, sizes, idx, data, limits.output_bytes):
                    over = "output"
                    break
            if over:
                break
    finally:
        sel.close()
        if proc.stdin and not proc.stdin.closed:
            try:
                proc.stdin.close()
            except OSError:
                pass
    return [b"".join(c) for c in chunks[:2]], b"".join(chunks[2]).decode("ascii", "replace"), over


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the program's whole process group and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()
    deadline = time.monotonic() + 5
    while not _reap(proc, block=False):
        if time.monotonic() > deadline:
            proc.kill()
            _reap(proc, block=True)
            break
        time.sleep(0.001)


def _reap(proc: subprocess.Popen, block: bool) -> bool:
    """Reap ``proc``; True once it has ended."""
    if proc.returncode is not None:
        return True
    try:
        pid, status = os.waitpid(proc.pid, 0 if block else os.WNOHANG)
    except ChildProcessError:  # reaped elsewhere: the time is unknown
        return proc.poll() is not None
    if pid == 0:
        return False
    proc.returncode = os.waitstatus_to_exitcode(status)
    return True


def _parse_status(text: str, token: str) -> tuple[str | None, float]:
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == token:
            try:
                return parts[1], float(parts[2])
            except ValueError:
                return parts[1], 0.0
    return None, 0.0


def _split_status_from_stderr(stderr: str, token: str) -> tuple[str, str]:
    """``(channel lines, the rest)`` of a stderr that also carried the status channel.

    The runner starts each of its lines there with a newline, so they begin a line.
    """
    prefix = token + " "
    if prefix not in stderr:
        return "", stderr
    lines = stderr.split("\n")
    channel = [ln for ln in lines if ln.startswith(prefix)]
    rest = [ln for ln in lines if not ln.startswith(prefix)]
    while rest and rest[-1] == "" and len(rest) > 1 and rest[-2] == "":
        rest.pop()
    return "\n".join(channel) + "\n", "\n".join(rest).rstrip("\n")


def runner_command(python: str) -> list[str]:
    """``python -I -S -c RUNNER``: isolated mode, no site-packages, no user paths."""
    return [python, "-I", "-S", "-c", RUNNER_SOURCE]
