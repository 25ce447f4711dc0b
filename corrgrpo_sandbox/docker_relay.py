"""The relay: a container's first process, and the host's one stream to it.

A container cannot inherit the host's file descriptors, and a remote engine
shares no folder with the host, so the docker backend reaches a container only
through the engine: its attach stream (the container's stdin and stdout, through
the Docker SDK). The relay (:mod:`corrgrpo_sandbox.inside.relay`, run as ``python3 -I -S -c`` by
the container's command: :func:`relay_command`) is pid 1 of the container. It

* installs the system-call filter it is given (stacked on the engine's own seccomp
  profile) before anything else runs, and makes itself non-dumpable (a program
  with the same uid can then neither trace it nor open its ``/proc`` files, such
  as its end of the attach stream);
* ``server`` mode: runs the fork server (:mod:`corrgrpo_sandbox.forkserver`)
  in its own main thread, so that the server is pid 1 (a program's SIGKILL or
  SIGSTOP never reaches it, and the server's clean-up spares pid 1), while a
  thread talks to the server over a socket pair and makes, for each program, the
  four pipes (stdin, stdout, stderr, status channel) the server hands to it; the
  server's ``_corrgrpo_quit`` is replaced so that the verdict of the program that
  made it unclean is forwarded before the container ends. ``runner`` mode: runs
  one fresh interpreter on such pipes (:func:`~corrgrpo_sandbox.base.runner_command`)
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
import socket
import struct
import threading
import time
import warnings

from corrgrpo_sandbox.base import _parse_status, append_capped
from corrgrpo_sandbox.calls import channel_text
from corrgrpo_sandbox.inside import program_text
from corrgrpo_sandbox.runner import SERVER_DEFINITIONS
from corrgrpo_sandbox.types import Limits, RunResult, decided_status

__all__ = ["RELAY_SOURCE", "ContainerSession", "frame", "relay_command"]

#: Seconds the host waits past a program's timeout before it gives up on the container.
HOST_GRACE = 2.0

#: The relay's program in ``runner`` mode (:mod:`corrgrpo_sandbox.inside.relay`).
RELAY_SOURCE = program_text("relay", run="_relay_main()")

#: ``server`` mode: the fork server's definitions first (the relay runs it in its own process,
#: pid 1 of the container).
_SERVER_RELAY_SOURCE = SERVER_DEFINITIONS + "\n" + RELAY_SOURCE


def relay_command(python: str, config: dict) -> list[str]:
    """The container's command: the relay (with the fork server's code in ``server`` mode)
    and its config (a Python literal)."""
    source = _SERVER_RELAY_SOURCE if config["mode"] == "server" else RELAY_SOURCE
    return [python, "-I", "-S", "-c", source, repr(config)]


def frame(kind: bytes, data: bytes = b"") -> bytes:
    """One frame of the relay protocol."""
    return kind + struct.pack(">I", len(data)) + data


class _ContainerProcess:
    """What :class:`~corrgrpo_sandbox.forkserver.ForkServerPool` asks of a server's
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
        create: keyword arguments of ``client.api.create_container`` (image, command, and
            the host config with the limits).
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
            self.container = client.containers.get(client.api.create_container(**create)["Id"])
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
        chunks, done, over = self._collect(limits)
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
        status = decided_status(status, over, returncode)
        stdout = b"".join(chunks[0]).decode("utf-8", "replace")
        stderr = b"".join(chunks[1]).decode("utf-8", "replace")
        return RunResult(status, stdout, stderr, exec_seconds, wall, returncode, self.backend,
                         {"reuse": self.reuse,
                          "container": self.container.short_id if self.container else ""},
                         cpu_seconds=cpu_seconds, channel=channel_text(status_text, token))

    def _collect(self, limits: Limits) -> tuple[list[list[bytes]], bytes | None, str | None]:
        """The program's stdout, stderr and status-channel bytes (each capped), the relay's
        ``D`` payload (``None`` when none came) and what went over: ``timeout``, ``output``."""
        chunks: list[list[bytes]] = [[], [], []]
        sizes = [0, 0, 0]
        deadline = time.monotonic() + limits.timeout + HOST_GRACE
        over: str | None = None
        while True:
            if time.monotonic() >= deadline:  # (a stream of output must not hold the host)
                return chunks, None, over or "timeout"
            kind, data = self._next(deadline)
            if kind in (b"1", b"2", b"3"):
                if append_capped(chunks, sizes, int(kind) - 1, data, limits.output_bytes) \
                        and over is None:
                    over = "output"
                    self._send(frame(b"K"))
                continue
            if kind == b"D":
                return chunks, data, over
            if kind == b"r":
                continue
            if not kind and self.alive and time.monotonic() >= deadline:
                over = over or "timeout"
            return chunks, None, over  # the relay stopped, the stream ended, or the deadline passed

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
