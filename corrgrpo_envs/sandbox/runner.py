"""The bootstrap that runs inside every sandbox, before the untrusted program.

It is passed to a fresh ``python -I -S -c`` and reads, from standard input, one
header line (a Python literal) and then the program's source. It applies the isolation that
must happen inside the new process (private mounts, dropped capabilities,
resource limits), runs the program with ``exec`` and reports the outcome on a
separate status channel, tagged with a one-time token so that a program cannot
forge a pass by printing or by exiting early.

The source is kept as a string (:data:`RUNNER_SOURCE`) because it runs in an
interpreter that cannot import this package (``-S`` drops site-packages).
"""

from __future__ import annotations

__all__ = ["RUNNER_SOURCE", "STATUS_OK", "STATUS_ASSERTION"]

STATUS_OK = "ok"
STATUS_ASSERTION = "assertion"

RUNNER_SOURCE = r'''
import sys, os
def _corrgrpo_boot():
    # The header is written by the host (trusted) as a Python literal: eval is far cheaper to
    # import than json, and start-up time is most of a short program's cost.
    header = eval(sys.stdin.buffer.readline().decode(), {"__builtins__": {}})
    source = sys.stdin.buffer.read().decode("utf-8", "replace")
    sys.stdin.close()
    token = header["token"]
    if header.get("isolate_fs"):
        _isolate_fs(header)
    if header.get("drop_caps"):
        _drop_caps()
    os.chdir(header["cwd"])
    for path in header.get("paths", []):
        sys.path.append(path)
    import resource
    for name, value in header.get("rlimits", {}).items():
        kind = getattr(resource, name)
        soft, hard = resource.getrlimit(kind)
        value = int(value)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        try:
            resource.setrlimit(kind, (value, value if name != "RLIMIT_CPU" else value + 1))
        except (ValueError, OSError):
            pass
    fd = header.get("status_fd")
    def report(status, seconds=0.0):
        line = ("%s %s %.9f\n" % (token, status, seconds)).encode()
        if fd is None:
            sys.stderr.flush()
            os.write(2, b"\n" + line)
        else:
            try:
                os.write(fd, line)
            except OSError:
                pass
    try:
        code = compile(source, "<program>", "exec")
    except (SyntaxError, ValueError, OverflowError, MemoryError, RecursionError):
        report("syntax")
        return
    del source, header
    import time
    scope = {"__name__": "__main__", "__builtins__": __builtins__}
    sys.argv = ["program"]
    start = time.perf_counter()
    try:
        exec(code, scope)
    except AssertionError:
        status = "assertion"
    except MemoryError:
        status = "memory"
    except BaseException as exc:
        status = "error:" + type(exc).__name__
    else:
        status = "ok"
    elapsed = time.perf_counter() - start
    try:
        sys.stdout.flush()
    except BaseException:
        pass
    report(status, elapsed)

def _isolate_fs(header):
    # Runs as (namespace) root inside fresh mount, pid and network namespaces.
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
    MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    def mount(src, target, fstype, flags, data=None):
        enc = lambda s: None if s is None else s.encode()
        if libc.mount(enc(src), enc(target), enc(fstype), flags, enc(data)) != 0:
            err = ctypes.get_errno()
            raise OSError(err, "mount %s: %s" % (target, os.strerror(err)))
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    keep = [os.open(p, os.O_PATH) for p in header.get("keep", [])]
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split()
            opts = parts[5].split(",")
            flags = 0
            for name, bit in (("nosuid", MS_NOSUID), ("nodev", MS_NODEV), ("noexec", MS_NOEXEC)):
                if name in opts:
                    flags |= bit
            points.append((parts[4].replace("\\040", " "), flags))
    for target, flags in points:
        if target.startswith("/proc"):
            continue
        try:
            mount(target, target, None, MS_BIND | MS_REC)
            mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | flags)
        except OSError:
            pass
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    size = "size=%d" % header.get("tmpfs_bytes", 64 << 20)
    for target in header.get("tmpfs", []):
        if os.path.isdir(target):
            mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, size + ",mode=1777")
    for fd, path in zip(keep, header.get("keep", [])):
        os.makedirs(path, exist_ok=True)
        mount("/proc/self/fd/%d" % fd, path, None, MS_BIND | MS_REC)
        mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY)
        os.close(fd)
    os.makedirs(header["cwd"], exist_ok=True)

def _drop_caps():
    # Stay uid 0 (the interpreter may live in a root-only folder) but give up
    # every capability, for this process and for anything it executes.
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_SET_SECUREBITS = 24, 38, 28
    for cap in range(64):
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    libc.prctl(PR_SET_SECUREBITS, 0x2F, 0, 0, 0)  # NOROOT, NO_SETUID_FIXUP, and their locks
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)
    data = (ctypes.c_uint32 * 6)()
    if libc.capset(header, data) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)

_corrgrpo_boot()
'''
