"""The docker backend's relay: pid 1 of a container, and the host's one stream to it.

Sent as text to ``python3 -I -S -c`` in the container (:func:`corrgrpo_sandbox.docker_relay.
relay_command`): after the fork server's program text in ``server`` mode, alone in ``runner``
mode. What it does and the frames it speaks are in :mod:`corrgrpo_sandbox.docker_relay`.
Standard library only.
"""

import os
import select
import signal
import socket
import struct
import sys
import threading
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # server mode: the same program text holds the fork server
    from corrgrpo_sandbox.inside.server import _corrgrpo_serve


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
                _send(b"x", f"relay: {exc!r}".encode())
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
        _send(b"x", f"the fork server did not start: {exc!r}".encode())
    _stop()
