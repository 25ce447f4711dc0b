"""The relay: a container's first process, and the host's one stream to it.

A container cannot inherit the host's file descriptors, and a remote engine
shares no folder with the host, so the docker backend reaches a container only
through the engine: its attach stream (the container's stdin and stdout, through
the Docker SDK). The relay (:data:`RELAY_SOURCE`, run as ``python3 -I -S -c`` by
the container's command: :func:`relay_command`) is pid 1 of the container. It

* installs the system-call filter it is given (stacked on the engine's own seccomp
  profile) before anything else runs, and makes itself non-dumpable (a program
  with the same uid can then neither trace it nor open its ``/proc`` files, such
  as its end of the attach stream);
* ``server`` mode: runs the fork server (:mod:`corrgrpo_envs.sandbox.forkserver`)
  in its own main thread, so that the server is pid 1 (a program's SIGKILL or
  SIGSTOP never reaches it, and the server's clean-up spares pid 1), while a
  thread talks to the server over a socket pair and makes, for each program, the
  four pipes (stdin, stdout, stderr, status channel) the server hands to it; the
  server's ``_corrgrpo_quit`` is replaced so that the verdict of the program that
  made it unclean is forwarded before the container ends. ``runner`` mode: runs
  one fresh interpreter on such pipes (:func:`~corrgrpo_envs.sandbox.base.runner_command`)
  and kills whatever is left when it ends;
* carries the pipes' bytes as frames on the attach stream;
* measures each program's CPU time from the container's control group (cgroup v2
  ``cpu.stat``, v1 ``cpuacct.usage``), which holds every process of the container
  whatever it does with signals, less the relay process's own time (its threads
  and the server's bookkeeping); ``-`` when the container has no readable group
  (the host then reports ``None``);
* after each program, checks that no socket of the container's network namespace
  (which its programs share) outlived it: an abstract unix name, a TCP or UDP port,
  or even an unnamed socket kept alive by a descriptor cycle is something the next
  program could see. When one did, it reports the server unclean and the container
  is replaced.

Frames (both directions): one kind byte, a 4-byte big-endian length, the payload.
Host to relay: ``R`` (start a program; payload: its timeout), ``I`` (stdin
bytes), ``E`` (end of stdin), ``K`` (kill the program). Relay to host: ``r``
(ready; payload ``cpu`` when CPU time is measured), ``1``/``2``/``3`` (stdout,
stderr, status-channel bytes), ``D`` (done: ``D <kind> <code> <clean> <cpu_ns or
->``, after the program's pipes are drained), ``x`` (the relay stops; payload:
why). When the host's end of the attach stream closes, the container's stdin ends
(``StdinOnce``) and the relay kills everything.
"""

from __future__ import annotations

import queue
import signal
import socket
import struct
import threading
import time
import warnings

from corrgrpo_envs.sandbox.base import Limits, RunResult, _parse_status, append_capped
from corrgrpo_envs.sandbox.calls import channel_text
from corrgrpo_envs.sandbox.runner import SERVER_SOURCE

__all__ = ["RELAY_SOURCE", "ContainerSession", "frame", "relay_command"]

#: Seconds the host waits past a program's timeout before it gives up on the container.
HOST_GRACE = 2.0

RELAY_SOURCE = r'''
import os, sys, struct, select, signal, socket, threading, time

def _frame(kind, data=b""):
    return kind + struct.pack(">I", len(data)) + data

def _write_all(data):
    view = memoryview(data)
    done = 0
    while done < len(view):
        done += os.write(1, view[done:])
    view.release()

def _send(kind, data=b""):
    # (frames of the relay's own: never a program's bytes, see Relay.forward)
    _write_all(_frame(kind, data))

def _install_filter(prog):
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    class Fprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]
    fprog = Fprog(len(prog) // 8, prog)
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        raise OSError(ctypes.get_errno(), "no_new_privs")
    if libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) != 0:  # PR_SET_SECCOMP, FILTER
        raise OSError(ctypes.get_errno(), "seccomp filter: " + os.strerror(ctypes.get_errno()))

def _cgroup_cpu():
    # a reader of the CPU nanoseconds of the container's control group, or None
    for path, v2 in (("/sys/fs/cgroup/cpu.stat", True),
                     ("/sys/fs/cgroup/cpuacct/cpuacct.usage", False),
                     ("/sys/fs/cgroup/cpu,cpuacct/cpuacct.usage", False)):
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        def read(fd=fd, v2=v2):
            text = os.pread(fd, 4096, 0).decode()
            if not v2:
                return int(text.split()[0])
            for line in text.splitlines():
                if line.startswith("usage_usec "):
                    return int(line.split()[1]) * 1000
            raise ValueError("no usage_usec")
        try:
            read()
            return read
        except (OSError, ValueError, IndexError):
            os.close(fd)
    return None

def _net_sockets():
    # every socket of the container's network namespace, by table and inode: one a program
    # keeps alive past its end (a descriptor cycle) is a name, a port or a count the next
    # program could see
    found = set()
    for table in ("unix", "tcp", "tcp6", "udp", "udp6", "udplite", "udplite6", "raw", "raw6",
                  "packet", "netlink"):
        try:
            with open("/proc/net/" + table) as f:
                rows = [line.split() for line in f.read().splitlines()[1:]]
        except OSError:
            continue
        if table == "unix":  # inode and name
            found.update((table, row[6], row[7] if len(row) > 7 else "") for row in rows
                         if len(row) > 6)
        elif table in ("packet", "netlink"):  # inode
            column = 8 if table == "packet" else 9
            found.update((table, row[column]) for row in rows if len(row) > column)
        else:  # addresses, state and inode (a connection in TIME_WAIT has inode 0)
            found.update((table, row[1], row[2], row[3], row[9]) for row in rows if len(row) > 9)
    return found

def _spawn(argv, fds):
    # fork + exec with fds as 0, 1, 2, 3 and nothing else open
    pid = os.fork()
    if pid == 0:
        try:
            high = [os.dup(fd) for fd in fds]
            for target, fd in enumerate(high):
                os.dup2(fd, target)
            os.closerange(len(fds), 1 << 20)
            os.execvp(argv[0], argv)
        finally:
            os._exit(127)
    return pid

def _kill_others():
    try:
        os.kill(-1, signal.SIGKILL)  # from pid 1: every other process of the container
    except OSError:
        pass

def _reap_all(deadline):
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            if time.monotonic() > deadline:
                return
            time.sleep(0.002)

def _stop():
    _kill_others()
    os._exit(0)

class Relay:
    # server mode: runs in a thread of the fork server's own process (pid 1), talking to the
    # server's main thread over ``ctl``; runner mode: pid 1, the interpreter as its child
    def __init__(self, config, ctl=None):
        self.config = config
        self.server = ctl is not None
        self.ctl = ctl
        self.head = b""  # the frame header being read from the host
        self.need = 0  # stdin bytes of the current frame still to come from the host
        # The only place a program's bytes (its source on the way in, its output on the way
        # out) ever are in this process, zeroed after each use: every program is forked from
        # this process and inherits its memory, so nothing of one may linger for the next.
        self.buf = bytearray(1 << 16)
        self.cpu = _cgroup_cpu()
        self.prog = None
        self.sockets = set()

    def wait_ready(self):
        ready = b""
        if select.select([self.ctl], [], [], self.config.get("start_timeout", 60))[0]:
            try:
                ready = self.ctl.recv(256)
            except OSError:
                ready = b""
        if ready != b"ready":
            _send(b"x", b"the fork server did not start (see stderr)")
            _stop()
        self.sockets = _net_sockets()

    def begin(self, timeout):
        pipes = [os.pipe() for _ in range(4)]
        theirs = [pipes[0][0], pipes[1][1], pipes[2][1], pipes[3][1]]
        mine = [pipes[0][1], pipes[1][0], pipes[2][0], pipes[3][0]]
        for fd in mine[1:]:
            os.set_blocking(fd, False)  # (stdin stays blocking: the runner reads all of it
        prog = {"stdin": mine[0],        # before the program starts)
                "outs": {mine[1]: b"1", mine[2]: b"2", mine[3]: b"3"},
                "done": None, "done_at": None, "pidfd": None,
                "cpu": self.cpu() if self.cpu else None, "self": time.process_time_ns()}
        if self.server:
            socket.send_fds(self.ctl, [b"R %r" % timeout], theirs)
        else:
            prog["pid"] = _spawn(self.config["argv"], theirs)
            prog["deadline"] = time.monotonic() + timeout
            try:
                prog["pidfd"] = os.pidfd_open(prog["pid"])
            except (AttributeError, OSError):
                prog["pidfd"] = None  # polled instead
        for fd in theirs:
            os.close(fd)
        self.prog = prog

    def stop_runner(self, kind):
        # runner mode: the interpreter must end now (timeout, kill request)
        _kill_others()
        status = os.waitpid(self.prog["pid"], 0)[1]
        self.runner_ended(kind, os.waitstatus_to_exitcode(status))

    def runner_ended(self, kind, code):
        # runner mode: the interpreter ended: kill and reap what it left behind
        prog = self.prog
        _kill_others()
        _reap_all(time.monotonic() + 2.0)
        if prog["pidfd"] is not None:
            os.close(prog["pidfd"])
            prog["pidfd"] = None
        prog["done"] = [b"D", kind, b"%d" % code, b"1", b"0"]
        prog["done_at"] = time.monotonic()

    def report(self):
        prog = self.prog
        parts = prog["done"]
        cpu = b"-"
        if prog["cpu"] is not None:
            # the container's group, less this process's own time (relay and server threads)
            used = self.cpu() - prog["cpu"] - (time.process_time_ns() - prog["self"])
            cpu = b"%d" % max(used, 0)
        clean = parts[3]
        if self.server and _net_sockets() - self.sockets:
            clean = b"0"  # a socket outlived its program: this container is done
        _send(b"D", b" ".join([parts[0], parts[1], parts[2], clean, cpu]))
        for fd in [prog["stdin"], *prog["outs"]]:
            if fd >= 0:
                os.close(fd)
        self.prog = None
        if not self.server or clean != b"1":
            _send(b"x", b"unclean" if self.server else b"done")
            _stop()

    def _read_exact(self, size):
        data = b""
        while len(data) < size:
            more = os.read(0, size - len(data))
            if not more:
                _stop()  # the host is gone
            data += more
        return data

    def on_host(self):
        # One read from the host: part of a frame header, or stdin bytes for the program.
        if self.need:
            view = memoryview(self.buf)[:min(self.need, len(self.buf))]
            n = os.readv(0, [view])
            if not n:
                _stop()
            self.need -= n
            prog = self.prog
            if prog is not None and prog["stdin"] >= 0:
                try:
                    done = 0
                    while done < n:
                        done += os.write(prog["stdin"], view[done:n])
                except OSError:  # the program is gone: the rest of its stdin is dropped
                    os.close(prog["stdin"])
                    prog["stdin"] = -1
            view[:n] = bytes(n)
            view.release()
            return
        more = os.read(0, 5 - len(self.head))
        if not more:  # the host is gone
            _stop()
        self.head += more
        if len(self.head) < 5:
            return
        kind, size = self.head[:1], struct.unpack(">I", self.head[1:])[0]
        self.head = b""
        prog = self.prog
        if kind == b"I":
            self.need = size
            return
        payload = self._read_exact(size)  # (R, E, K: a timeout at most)
        if kind == b"R" and prog is None:
            self.begin(float(payload))
        elif kind == b"E" and prog is not None and prog["stdin"] >= 0:
            os.close(prog["stdin"])
            prog["stdin"] = -1
        elif kind == b"K" and prog is not None and prog["done"] is None:
            if self.server:
                try:
                    self.ctl.send(b"K")
                except OSError:
                    pass
            else:
                self.stop_runner(b"killed")

    def forward(self, fd, kind):
        # One read of a program's pipe, sent on as a frame; False at its end.
        view = memoryview(self.buf)
        try:
            n = os.readv(fd, [view])
        except BlockingIOError:
            view.release()
            return True
        except OSError:
            n = 0
        if n:
            _write_all(kind + struct.pack(">I", n))
            _write_all(view[:n])
            view[:n] = bytes(n)
        view.release()
        return n > 0

    def loop(self):
        while True:
            prog = self.prog
            readers = [0]
            timeout = 1.0
            if self.server:
                readers.append(self.ctl)
            if prog is not None:
                readers += list(prog["outs"])
                if prog["done"] is not None:
                    left = prog["done_at"] + 0.5 - time.monotonic()
                    if not prog["outs"] or left <= 0:
                        self.report()
                        continue
                    timeout = left
                elif not self.server:
                    timeout = max(0.0, prog["deadline"] - time.monotonic())
                    if prog["pidfd"] is None:
                        timeout = min(timeout, 0.02)
                    else:
                        readers.append(prog["pidfd"])
            ready_r = select.select(readers, [], [], timeout)[0]
            for fd in ready_r:
                if fd == 0:
                    self.on_host()
                elif fd is self.ctl:
                    try:
                        msg = self.ctl.recv(256)
                    except OSError:
                        msg = b""
                    parts = msg.split()
                    if prog is not None and len(parts) == 5 and parts[0] == b"D":
                        prog["done"] = parts
                        prog["done_at"] = time.monotonic()
                elif prog is not None and fd in prog["outs"]:
                    if not self.forward(fd, prog["outs"][fd]):
                        del prog["outs"][fd]
                        os.close(fd)
            prog = self.prog
            if prog is not None and not self.server and prog["done"] is None:
                pid, status = os.waitpid(prog["pid"], os.WNOHANG)
                if pid:
                    self.runner_ended(b"exit", os.waitstatus_to_exitcode(status))
                elif time.monotonic() >= prog["deadline"]:
                    self.stop_runner(b"timeout")

    def serve_host(self):
        try:
            if self.server:
                self.wait_ready()
            _send(b"r", b"cpu" if self.cpu else b"")
            self.loop()
        except BaseException as exc:
            try:
                _send(b"x", ("relay: %r" % (exc,)).encode())
            finally:
                _stop()

def _corrgrpo_quit():
    # (replaces the fork server's own: the relay thread first forwards the verdict and the
    # last output of the program that made the server unclean, then ends the container)
    time.sleep(3.0)  # the relay thread ends the process once it has reported
    _stop()

def _relay_main():
    import ctypes
    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0
    config = eval(sys.argv[1], {"__builtins__": {}})
    if config.get("filter"):
        _install_filter(bytes.fromhex(config["filter"]))
    if config["mode"] != "server":
        Relay(config).serve_host()
        return
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    relay = Relay(config, ours)
    # Every program is forked from this process and inherits its address space, which its
    # RLIMIT_AS counts: the thread gets a small stack and no malloc arena of its own (64 MB).
    ctypes.CDLL(None).mallopt(-8, 1)  # M_ARENA_MAX
    threading.stack_size(1 << 18)
    threading.Thread(target=relay.serve_host, daemon=True).start()
    sys.argv = ["-c", str(theirs.fileno()), repr(config["server"])]
    try:
        _corrgrpo_serve()
    except BaseException as exc:  # (the relay thread waits for ready: it writes nothing)
        import traceback
        traceback.print_exc()
        sys.stderr.flush()
        _send(b"x", ("the fork server did not start: %r" % (exc,)).encode())
    _stop()

_relay_main()
'''

#: The fork server's source without its last line (the call that starts it): the relay
#: runs the server in its own process, pid 1 of the container.
_SERVER_CALL = "\n_corrgrpo_serve()\n"
if not SERVER_SOURCE.endswith(_SERVER_CALL):  # pragma: no cover - a changed runner module
    raise ImportError("corrgrpo_envs.sandbox.runner.SERVER_SOURCE no longer ends with the "
                      "call that starts the fork server; the docker relay cannot embed it")
_SERVER_DEFINITIONS = SERVER_SOURCE[: -len(_SERVER_CALL)]


def relay_command(python: str, config: dict) -> list[str]:
    """The container's command: the relay (with the fork server's code in ``server`` mode)
    and its config (a Python literal)."""
    source = RELAY_SOURCE
    if config["mode"] == "server":
        source = _SERVER_DEFINITIONS + "\n" + RELAY_SOURCE
    return [python, "-I", "-S", "-c", source, repr(config)]


def frame(kind: bytes, data: bytes = b"") -> bytes:
    """One frame of the relay protocol."""
    return kind + struct.pack(">I", len(data)) + data


class _ContainerProcess:
    """What :class:`~corrgrpo_envs.sandbox.forkserver.ForkServerPool` asks of a server's
    process: ``poll()`` (``None`` while the relay answers) and ``pid`` (the container's first
    process as the engine's machine numbers it)."""

    def __init__(self, session: ContainerSession, pid: int):
        self._session = session
        self.pid = pid

    def poll(self) -> int | None:
        return None if self._session.alive else 0


class ContainerSession:
    """The host's end of one container and its relay, through the Docker SDK.

    Args:
        client: a ``docker.DockerClient``.
        create: keyword arguments of ``client.containers.create`` (image, command, limits).
        backend: the backend name put in results.
        start_timeout: seconds to wait for the relay's ``ready``.
        errors: turns a ``docker.errors.DockerException`` into the exception to raise.
        reuse: put in results' ``extra`` (``fork``: a fork server; ``fresh``: one program).

    Raises:
        SandboxUnavailable: the engine refused the container (with its message) or the
            relay did not report ready.
    """

    def __init__(self, client, create: dict, backend: str, start_timeout: float, errors,
                 reuse: str = "fork"):
        import docker.utils.socket as docker_socket

        self.backend = backend
        self.reuse = reuse
        self.programs = 0
        self.healthy = True
        self.alive = True
        self.cpu_visible = False
        self._client = client
        self._errors = errors
        self._frames: queue.Queue = queue.Queue()
        self._relay_stderr: list[bytes] = []
        self._write_lock = threading.Lock()
        self._docker_socket = docker_socket
        self.container = None
        try:
            self.container = client.containers.create(**create)
            # attached before the start: nothing the relay writes is lost
            self._sock = client.api.attach_socket(
                self.container.id, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1})
            self.container.start()
            self.container.reload()
        except Exception as exc:
            self.close()
            raise errors(exc) from exc
        self.proc = _ContainerProcess(self, int(self.container.attrs["State"].get("Pid") or 0))
        self._reader = threading.Thread(target=self._read, name="corrgrpo-docker-relay",
                                        daemon=True)
        self._reader.start()
        kind, payload = self._next(time.monotonic() + start_timeout)
        if kind != b"r":
            self.close()
            why = payload.decode("utf-8", "replace") if kind == b"x" else "no answer"
            raise errors(RuntimeError(f"the container's relay did not start: {why.strip()[-2000:]}"
                                      f"{self.relay_stderr()}"))
        self.cpu_visible = payload == b"cpu"

    # ------------------------------------------------------------ streams
    def _read(self) -> None:
        """Demultiplex the attach stream (the SDK's frames) into relay frames on a queue."""
        buf = b""
        try:
            for stream, data in self._docker_socket.frames_iter(self._sock, tty=False):
                if stream != self._docker_socket.STDOUT:
                    if sum(map(len, self._relay_stderr)) < 1 << 16:
                        self._relay_stderr.append(data)
                    continue
                buf += data
                while len(buf) >= 5:
                    size = struct.unpack(">I", buf[1:5])[0]
                    if len(buf) < 5 + size:
                        break
                    self._frames.put((buf[:1], buf[5 : 5 + size]))
                    buf = buf[5 + size :]
        except Exception:  # the socket was closed under us (close()) or the engine went away
            pass
        finally:
            self.alive = False
            self._frames.put((b"", b""))

    def _next(self, deadline: float) -> tuple[bytes, bytes]:
        """The next relay frame; ``(b"", b"")`` at the end of the stream or past ``deadline``."""
        try:
            return self._frames.get(timeout=max(deadline - time.monotonic(), 0.0))
        except queue.Empty:
            return b"", b""

    def _raw(self):
        """The socket under the SDK's attach stream (a ``SocketIO`` on plain HTTP)."""
        return getattr(self._sock, "_sock", self._sock)

    def _send(self, data: bytes) -> bool:
        with self._write_lock:
            try:
                self._raw().sendall(data)
                return True
            except (OSError, ValueError, AttributeError):
                return False

    def relay_stderr(self) -> str:
        text = b"".join(self._relay_stderr).decode("utf-8", "replace").strip()
        return f"; relay stderr: {text[-2000:]}" if text else ""

    # ------------------------------------------------------------ programs
    def run(self, header: dict, program: str, limits: Limits) -> RunResult | None:
        """Run one program; ``None`` when the container was gone before it started."""
        token = header["token"]
        payload = repr({**header, "status_fd": 3}).encode() + b"\n" + program.encode("utf-8", "replace")
        start = time.perf_counter()
        message = frame(b"R", repr(float(limits.timeout)).encode())
        message += b"".join(frame(b"I", payload[i : i + 65536])
                            for i in range(0, len(payload), 65536))
        if not self.alive or not self._send(message + frame(b"E")):
            self.healthy = False
            return None
        self.programs += 1
        chunks: list[list[bytes]] = [[], [], []]
        sizes = [0, 0, 0]
        deadline = time.monotonic() + limits.timeout + HOST_GRACE
        done: bytes | None = None
        over: str | None = None
        while True:
            if time.monotonic() >= deadline:  # (a stream of output must not hold the host)
                over = over or "timeout"
                break
            kind, data = self._next(deadline)
            if kind in (b"1", b"2", b"3"):
                if append_capped(chunks, sizes, int(kind) - 1, data, limits.output_bytes) \
                        and over is None:
                    over = "output"
                    self._send(frame(b"K"))
                continue
            if kind == b"D":
                done = data
                break
            if kind == b"r":
                continue
            if not kind and self.alive and time.monotonic() >= deadline:
                over = over or "timeout"
            break  # the relay stopped, the stream ended, or the deadline passed
        wall = time.perf_counter() - start
        status_text = b"".join(chunks[2]).decode("ascii", "replace")
        status, exec_seconds = _parse_status(status_text, token)
        returncode = cpu_seconds = None
        parts = done.split() if done else []
        if len(parts) != 5:  # the container died (a program killed it?) or hung
            self.healthy = False
            status = "timeout" if over == "timeout" else "killed"
        else:
            kind_text, code, clean, cpu = parts[1].decode(), int(parts[2]), parts[3] == b"1", parts[4]
            returncode = code
            self.healthy = self.healthy and clean
            cpu_seconds = int(cpu) / 1e9 if cpu.isdigit() else None
            if kind_text == "timeout":
                status = "timeout"
        if over == "output":
            status = "output_limit"
        elif status is None:
            status = "killed"
            if returncode is not None and returncode < 0:
                status = f"killed:{signal.Signals(-returncode).name}"
        stdout = b"".join(chunks[0]).decode("utf-8", "replace")
        stderr = b"".join(chunks[1]).decode("utf-8", "replace")
        return RunResult(status, stdout, stderr, exec_seconds, wall, returncode, self.backend,
                         {"reuse": self.reuse,
                          "container": self.container.short_id if self.container else ""},
                         cpu_seconds=cpu_seconds, channel=channel_text(status_text, token))

    def close(self) -> None:
        """Remove the container (killing everything in it) and end the stream.

        An engine that cannot be reached gets a warning with its message, not an exception
        (this runs when a server is discarded in the middle of a run): the container ends
        anyway once its stdin closes with the stream, and the engine removes it.
        """
        self.healthy = False
        container, self.container = self.container, None
        if container is not None:
            try:
                container.remove(force=True)
            except Exception as exc:  # already gone (auto-removed) or being removed
                if getattr(getattr(exc, "response", None), "status_code", None) in (404, 409):
                    try:  # the engine is removing it: wait until it is gone
                        container.wait(condition="removed", timeout=30)
                    except Exception:
                        pass
                else:
                    warnings.warn(f"cannot remove container {container.short_id}: "
                                  f"{self._errors(exc)}", RuntimeWarning, stacklevel=2)
        if getattr(self, "_sock", None) is not None:
            raw = self._raw()
            for end in (lambda: raw.shutdown(socket.SHUT_RDWR), self._sock.close, raw.close):
                try:
                    end()
                except OSError:
                    pass
