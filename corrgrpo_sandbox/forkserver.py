"""Reused sandboxes: one long-lived fork server per worker, one forked child per program.

Starting ``python`` (and bubblewrap) costs tens of milliseconds, often more than
the judged program itself. A fork server pays that once: it starts inside one
sandbox (the same namespaces, read-only allow-list root and private ``/tmp`` as a fresh
run), isolates itself, preloads common standard-library modules, marks itself
non-dumpable, and then forks one child per program. The child starts a new
session, takes the program's pipes as stdin/stdout/stderr and status channel,
closes everything else (the control socket included), and runs the same
bootstrap as a fresh interpreter: fresh folder ``/tmp/work``, resource limits,
``exec``, status tagged with a one-time token.

After every program the server

* enforces the wall timeout by killing the child's process group,
* kills every other process of its pid namespace (children left behind, fork
  bombs) and waits until none is left,
* puts the writable file systems (``/tmp``, ``/var/tmp``, ``/dev``,
  ``/dev/shm``) back exactly as they were at start-up and
  checks that no System V IPC object is left,
* compares itself with its start-up (each thread's nice value, I/O priority,
  scheduling and affinity; its limits...: what a later child would inherit, and
  what a program of its uid may change where the server holds no capability the
  program lacks, as under docker) and puts back what needs no capability,

so nothing a program writes (globals, modules, environment variables, files,
processes) reaches the next one. Whatever it cannot undo makes it quit. The host
side (:class:`ForkServer`) feeds the program and drains its output with the
same caps as a fresh run, asks the server to kill a program that prints too
much, and discards a server that died, hung past the timeout, stayed dirty or
served ``max_programs`` programs; :class:`ForkServerPool` starts a new one on
the next run. A program that kills its server gets status ``killed``.

Programs of one server share its hash seed (``PYTHONHASHSEED``) and its
preloaded modules' initial state; ``random`` reseeds itself in every child.
"""

from __future__ import annotations

import os
import selectors
import signal
import socket
import subprocess
import threading
import time
import warnings
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor

from corrgrpo_sandbox.base import Sandbox, _parse_status, append_capped
from corrgrpo_sandbox.calls import channel_text
from corrgrpo_sandbox.cgroups import SandboxCgroup, new_cgroup
from corrgrpo_sandbox.runner import PRELOAD_MODULES, SERVER_SOURCE
from corrgrpo_sandbox.seccomp import syscall_numbers
from corrgrpo_sandbox.types import (
    MINIMAL_ENV,
    SANDBOX_CWD,
    Limits,
    RunResult,
    SandboxUnavailable,
    decided_status,
    new_token,
)

__all__ = ["ForkServer", "ForkServerPool", "ForkingSandbox", "REUSE_MODES", "server_command"]

#: ``auto``: fork servers where the backend supports them, else fresh interpreters.
REUSE_MODES = ("auto", "fork", "fresh")

#: The fd the child's status channel gets (after stdin, stdout, stderr).
STATUS_FD = 3

#: Seconds the host waits past a program's timeout before it gives up on the server.
_HOST_GRACE = 1.0


_SPAWNER: tuple[int, ThreadPoolExecutor] | None = None
_SPAWNER_LOCK = threading.Lock()


def _spawn(*args: object, **kwargs: object) -> subprocess.Popen:
    """``Popen`` from one long-lived thread of this process.

    ``bwrap --die-with-parent`` (``PR_SET_PDEATHSIG``) fires when the *thread* that
    started the sandbox ends, and the threads of a pool come and go while its
    servers should live on.
    """
    global _SPAWNER
    with _SPAWNER_LOCK:
        if _SPAWNER is None or _SPAWNER[0] != os.getpid():  # (a forked host has no such thread)
            _SPAWNER = (os.getpid(), ThreadPoolExecutor(1, thread_name_prefix="corrgrpo-spawner"))
        spawner = _SPAWNER[1]
    return spawner.submit(subprocess.Popen, *args, **kwargs).result()


def server_command(python: str, config: dict, control_fd: int) -> list[str]:
    """``python -I -S -c SERVER <fd> <config>``: the fork server's command line."""
    config = {"preload": PRELOAD_MODULES, "syscalls": syscall_numbers(), **config}
    return [python, "-I", "-S", "-c", SERVER_SOURCE, str(control_fd), repr(config)]


class ForkServer:
    """The host's handle on one fork server.

    Args:
        command: builds the full command line (sandbox prefix + :func:`server_command`)
            from the fd number of the server's end of the control socket (or from
            ``listen``, when given).
        backend: the backend name put in results.
        start_timeout: seconds to wait for the server to report ready.
        listen: a socket path the server connects to instead of inheriting an fd
            (a container cannot inherit one; the path must be reachable only by it).
        on_close: called once the server is killed (e.g. to remove its container).
    """

    def __init__(self, command: Callable[[int | str], list[str]], backend: str,
                 start_timeout: float = 30.0, listen: str | None = None,
                 on_close: Callable[[], None] | None = None):
        self.backend = backend
        self.programs = 0
        self.healthy = True
        self._on_close = on_close
        listener = theirs = None
        if listen is None:
            self._sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        else:
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            listener.bind(listen)
            os.chmod(listen, 0o777)  # its folder decides who can reach it
            listener.listen(1)
        try:
            self.proc = _spawn(
                command(theirs.fileno() if theirs else str(listen)), stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=dict(MINIMAL_ENV), cwd="/",
                pass_fds=(theirs.fileno(),) if theirs else (), start_new_session=True, close_fds=True,
            )
        except OSError as exc:
            (listener or self._sock).close()
            raise SandboxUnavailable(f"cannot start the fork server: {exc}") from exc
        finally:
            if theirs is not None:
                theirs.close()
        if listener is not None:
            self._sock = _accept_within(listener, start_timeout)
        ready = _recv_within(self._sock, start_timeout)
        if ready != b"ready":
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            err = self.proc.stderr.read().decode("utf-8", "replace") if self.proc.stderr else ""
            self.close()
            raise SandboxUnavailable(f"the fork server did not start: {err.strip()[-2000:]!r}")
        assert self.proc.stderr is not None
        self.proc.stderr.close()  # the server itself never writes there once ready

    def run(self, header: dict, program: str, limits: Limits) -> RunResult | None:
        """Run one program; ``None`` when the server was gone before it started."""
        token = header["token"]
        payload = repr({**header, "status_fd": STATUS_FD}).encode() + b"\n" \
            + program.encode("utf-8", "replace")
        pipes = [os.pipe() for _ in range(4)]  # stdin, stdout, stderr, status
        theirs = [pipes[0][0], pipes[1][1], pipes[2][1], pipes[3][1]]
        ours = [pipes[0][1], pipes[1][0], pipes[2][0], pipes[3][0]]
        start = time.perf_counter()
        try:
            socket.send_fds(self._sock, [b"R %r" % float(limits.timeout)], theirs)
            started = True
        except OSError:
            started = False
        for fd in theirs:
            os.close(fd)
        if not started:
            self.healthy = False
            for fd in ours:
                os.close(fd)
            return None
        self.programs += 1
        try:
            outputs, status_text, done, over = self._drain(ours, payload, limits, start)
        finally:
            for fd in ours:
                if fd >= 0:  # the drain closes stdin itself once the program is sent
                    os.close(fd)
        wall = time.perf_counter() - start
        status, exec_seconds = _parse_status(status_text, token)
        returncode = None
        cpu_seconds = None
        if done is None:  # the server died (a program killed it) or hung: never trust it again
            self.healthy = False
            status = "timeout" if over == "timeout" else "killed"
        else:
            kind, returncode, clean, cpu_seconds = done
            self.healthy = self.healthy and clean
            if kind == "timeout":
                status = "timeout"
        status = decided_status(status, over, returncode)
        stdout = outputs[0].decode("utf-8", "replace")
        stderr = outputs[1].decode("utf-8", "replace")
        return RunResult(status, stdout, stderr, exec_seconds, wall, returncode, self.backend,
                         {"reuse": "fork"}, cpu_seconds=cpu_seconds,
                         channel=channel_text(status_text, token))

    def _drain(self, fds: list[int], payload: bytes, limits: Limits, start: float):
        """Feed stdin; collect stdout/stderr/status and the server's verdict (or its death)."""
        stdin_w, out_r, err_r, status_r = fds  # (stdin: closed by _feed once all is sent)
        sel = selectors.DefaultSelector()
        os.set_blocking(stdin_w, False)
        sel.register(stdin_w, selectors.EVENT_WRITE, "in")
        sel.register(out_r, selectors.EVENT_READ, 0)
        sel.register(err_r, selectors.EVENT_READ, 1)
        sel.register(status_r, selectors.EVENT_READ, 2)
        sel.register(self._sock, selectors.EVENT_READ, "ctl")
        chunks: list[list[bytes]] = [[], [], []]
        sizes = [0, 0, 0]
        sent = 0
        deadline = start + limits.timeout + _HOST_GRACE
        done: tuple[str, int, bool, float | None] | None = None
        ended_at: float | None = None  # verdict received or server lost
        over: str | None = None
        try:
            while True:
                pipes_open = sum(1 for key in sel.get_map().values() if key.data in (0, 1, 2))
                now = time.perf_counter()
                if ended_at is not None and (not pipes_open or now - ended_at > 0.5):
                    break
                if ended_at is None and now >= deadline:
                    over = over or "timeout"
                    break
                wait = 0.5 if ended_at is None else 0.05
                for key, _ in sel.select(timeout=min(wait, max(deadline - now, 0.001))):
                    if key.data == "in":
                        sent = _feed(sel, fds, payload, sent)
                        continue
                    if key.data == "ctl":
                        try:
                            msg = self._sock.recv(256)
                        except OSError:
                            msg = b""
                        sel.unregister(self._sock)
                        ended_at = time.perf_counter()
                        done = _parse_done(msg)
                        continue
                    data = os.read(key.fd, 65536)
                    if not data:
                        sel.unregister(key.fd)
                        continue
                    idx = key.data
                    if append_capped(chunks, sizes, idx, data, limits.output_bytes) and over is None:
                        over = "output"
                        try:
                            self._sock.send(b"K")
                        except OSError:
                            pass
        finally:
            sel.close()
        return ([b"".join(c) for c in chunks[:2]], b"".join(chunks[2]).decode("ascii", "replace"),
                done, over)

    def close(self) -> None:
        """Kill the server (and its whole sandbox) and reap it."""
        self.healthy = False
        try:
            self._sock.close()
        except OSError:
            pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        on_close, self._on_close = self._on_close, None
        if on_close is not None:
            on_close()


def _accept_within(listener: socket.socket, seconds: float) -> socket.socket:
    """The server's connection to ``listener`` (a closed socket when none came in time)."""
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    try:
        if sel.select(timeout=seconds):
            return listener.accept()[0]
        return socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)  # recv fails: not ready
    finally:
        sel.close()
        listener.close()


def _recv_within(sock: socket.socket, seconds: float) -> bytes:
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ)
    try:
        if not sel.select(timeout=seconds):
            return b""
        return sock.recv(256)
    except OSError:
        return b""
    finally:
        sel.close()


def _feed(sel: selectors.BaseSelector, fds: list[int], payload: bytes, sent: int) -> int:
    """One write of the program's header and source on its stdin (``fds[0]``); once all of it
    is sent, stdin is closed and ``fds[0]`` set to -1. Returns the bytes sent so far."""
    try:
        sent += os.write(fds[0], payload[sent : sent + 65536])
    except (BlockingIOError, InterruptedError):
        return sent
    except OSError:
        sent = len(payload)
    if sent >= len(payload):
        sel.unregister(fds[0])
        os.close(fds[0])
        fds[0] = -1  # closed: the caller must not close the number again
    return sent


def _parse_done(msg: bytes) -> tuple[str, int, bool, float | None] | None:
    """``(kind, exit code, clean, cpu seconds or None)`` of the server's ``D`` message."""
    parts = msg.split()
    if len(parts) != 5 or parts[0] != b"D":
        return None
    try:
        cpu_ns = int(parts[4])
        return parts[1].decode(), int(parts[2]), parts[3] == b"1", \
            cpu_ns / 1e9 if cpu_ns >= 0 else None
    except ValueError:
        return None


class ForkServerPool:
    """Idle fork servers of one sandbox, keyed by what their start-up depends on.

    Each thread that runs a program takes an idle server with the right key (or
    starts one), so there are as many servers as programs ever ran at once.

    Args:
        start: starts a server for the given limits.
        key: what in the limits a server is started with (e.g. the ``/tmp`` size).
        max_programs: programs a server serves before it is replaced.
    """

    def __init__(self, start: Callable[[Limits], ForkServer], key: Callable[[Limits], Hashable],
                 max_programs: int = 1000):
        if max_programs < 1:
            raise ValueError(f"max_programs must be >= 1, got {max_programs}")
        self._start = start
        self._key = key
        self.max_programs = int(max_programs)
        self._idle: dict[Hashable, list[ForkServer]] = {}
        self._lock = threading.Lock()
        self._closed = False

    def run(self, header: dict, program: str, limits: Limits) -> RunResult:
        """Run ``program`` on an idle server, starting one when none is free."""
        for _ in range(3):  # a server found dead before the program started is replaced
            server = self._acquire(limits)
            try:
                result = server.run(header, program, limits)
            finally:
                self._release(server, limits)
            if result is not None:
                return result
        return RunResult("sandbox_error", stderr="fork servers keep dying before a program starts",
                         backend="", extra={"reuse": "fork"})

    def _acquire(self, limits: Limits) -> ForkServer:
        key = self._key(limits)
        while True:
            with self._lock:
                idle = self._idle.get(key)
                server = idle.pop() if idle else None
            if server is None:
                return self._start(limits)
            if server.proc.poll() is None:
                return server
            server.close()  # died while idle

    def _release(self, server: ForkServer, limits: Limits) -> None:
        if server.healthy and server.programs < self.max_programs and server.proc.poll() is None:
            with self._lock:
                if not self._closed:
                    self._idle.setdefault(self._key(limits), []).append(server)
                    return
        server.close()

    def close(self) -> None:
        """Stop every idle server (busy ones stop when their program ends)."""
        with self._lock:
            servers = [s for idle in self._idle.values() for s in idle]
            self._idle.clear()
            self._closed = True
        for server in servers:
            server.close()

    def servers(self) -> list[ForkServer]:
        """The idle servers (for inspection)."""
        with self._lock:
            return [s for idle in self._idle.values() for s in idle]



def _tmp_size_key(limits: Limits) -> tuple[int, int, int]:
    """Servers are started with tmpfs sized by ``file_size_mb`` and a control group sized by
    ``memory_mb`` and ``processes``; everything else is per program."""
    return int(limits.file_size_mb), int(limits.memory_mb), int(limits.processes)


class ForkingSandbox(Sandbox):
    """A sandbox that runs programs either in fresh interpreters or through fork servers.

    Subclasses provide :meth:`_server_prefix` and :meth:`_server_config` (how a server
    is isolated) and :meth:`_fork_unsupported`, and call :meth:`_run_forked` from
    ``run`` when :attr:`forking` is true.

    Args:
        reuse: ``auto`` (fork servers where supported, else fresh), ``fork`` or ``fresh``.
        max_programs: programs one server runs before it is replaced.
    """

    def __init__(self, limits: Limits | None = None, python: str | None = None,
                 paths: list[str] | None = None, reuse: str = "auto", max_programs: int = 1000,
                 hide: list[str] | None = None):
        super().__init__(limits, python, paths, hide)
        if reuse not in REUSE_MODES:
            raise ValueError(f"reuse must be one of {REUSE_MODES}, got {reuse!r}")
        if int(max_programs) < 1:
            raise ValueError(f"max_programs must be >= 1, got {max_programs}")
        self.reuse = reuse
        self.max_programs = int(max_programs)
        self._forks: ForkServerPool | None = None
        self._fork_error = ""
        self._fork_lock = threading.Lock()

    # ------------------------------------------------------------ subclass hooks
    def _server_prefix(self, limits: Limits) -> list[str]:
        """The isolation wrapper in front of the server's interpreter."""
        raise NotImplementedError

    def _server_config(self, limits: Limits) -> dict:
        """Set-up the server applies to itself before ``ready`` (mounts, capabilities)."""
        return {}

    def _fork_unsupported(self) -> str:
        """Why fork servers cannot isolate programs here; ``""`` when they can."""
        return ""

    def _server_launch(self, limits: Limits, group: SandboxCgroup | None) -> tuple[list[str], dict]:
        """The server's isolation prefix and config. A backend that can show the server its
        control group (``group.program_group``, bound at ``SERVER_CPU_MOUNT``, and
        ``cpu_group``, ``cpu_file``, ``cpu_mount`` in the config) gets each program's CPU
        time from it; by default programs get none (``cpu_seconds=None``)."""
        return self._server_prefix(limits), self._server_config(limits)

    # ------------------------------------------------------------------ fork mode
    @property
    def forking(self) -> bool:
        """Whether :meth:`run` goes through fork servers (``reuse`` and what this machine allows)."""
        if self.reuse == "fresh" or self._fork_error:
            return False
        return self.reuse == "fork" or not self._fork_unsupported()

    def _run_forked(self, program: str, limits: Limits) -> RunResult | None:
        """Run through a fork server; ``None`` means: run it fresh instead (``reuse="auto"``)."""
        reason = self._fork_unsupported()
        if not reason:
            with self._fork_lock:
                if self._forks is None:
                    self._forks = ForkServerPool(self._start_server, _tmp_size_key, self.max_programs)
                forks = self._forks
            header = self._header(new_token(), limits, cwd=SANDBOX_CWD, make_cwd=True)
            try:
                result = forks.run(header, program, limits)
                result.backend = self.name
                return result
            except SandboxUnavailable as exc:
                reason = str(exc)
                if self.reuse == "auto":
                    warnings.warn(f"sandbox {self.name}: fork servers unavailable, every program "
                                  f"starts a fresh sandbox instead (slower): {reason}",
                                  RuntimeWarning, stacklevel=3)
        if self.reuse == "fork":
            return RunResult("sandbox_error", stderr=reason, backend=self.name, extra={"reuse": "fork"})
        self._fork_error = reason
        return None

    def _start_server(self, limits: Limits) -> ForkServer:
        # the whole sandbox's memory and process cap, and its CPU time
        group = new_cgroup(limits, server=True)
        try:
            prefix, config = self._server_launch(limits, group)
        except BaseException:
            if group is not None:
                group.close()
            raise
        if group is not None:
            prefix = [*group.enter(), *prefix]
        try:
            return ForkServer(lambda fd: [*prefix, *server_command(self.python, config, fd)],
                              self.name, on_close=group.close if group else None)
        except BaseException:
            if group is not None:
                group.close()
            raise

    def close(self) -> None:
        """Stop the fork servers (a later run starts new ones)."""
        with self._fork_lock:
            forks, self._forks = self._forks, None
        if forks is not None:
            forks.close()

    #: attributes holding locks: pickled as fresh ones
    _lock_names: tuple[str, ...] = ("_fork_lock",)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_forks"] = None  # servers are processes of this host process, not state
        for name in self._lock_names:
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        for name in self._lock_names:
            setattr(self, name, threading.Lock())
