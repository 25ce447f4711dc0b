"""What a fork server checks and puts back after each program, inside the sandbox.

Part of the fork server's program text (:data:`corrgrpo_sandbox.runner.SERVER_SOURCE`): the
writable file systems as they were at start-up, the server's own process attributes (which a
program could change, and every later child would inherit), and kernel objects of the
program's uid (keys, sockets, System V IPC). Whatever cannot be put back makes the server
quit; the host then starts a new one. Standard library only.
"""

import os

TYPE_CHECKING = False
if TYPE_CHECKING:  # the same program text holds the bootstrap (see corrgrpo_sandbox.runner)
    from corrgrpo_sandbox.inside.boot import _corrgrpo_libc, _corrgrpo_syscall_nr


def _corrgrpo_writable_roots():
    # The tmpfs mounts a program can write to; a later mount on the same point hides the
    # earlier ones, so the last line of each point decides.
    top = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split()
            fstype = parts[parts.index("-") + 1]
            top[parts[4].replace("\\040", " ")] = (fstype in ("tmpfs", "mqueue")
                                                    and "rw" in parts[5].split(","))
    # (folders only: a container masks files such as /proc/keys with a tmpfs file)
    # (kernel file systems are not the program's to write: /sys/fs/cgroup of a container)
    return [point for point, writable in top.items()
            if writable and os.path.isdir(point) and not os.path.islink(point)
            and not point.startswith(("/proc/", "/sys/")) and point not in ("/proc", "/sys")]


def _corrgrpo_xattrs(path):
    try:
        names = os.listxattr(path, follow_symlinks=False)
        return tuple(sorted((n, os.getxattr(path, n, follow_symlinks=False)) for n in names))
    except OSError:
        return ()


def _corrgrpo_entry(st, path):
    # type, mode, owner, size (files), modification time and extended attributes
    is_dir = (st.st_mode & 0o170000) == 0o040000
    return (st.st_mode, st.st_uid, st.st_gid, 0 if is_dir else st.st_size, st.st_mtime_ns,
            _corrgrpo_xattrs(path))


def _corrgrpo_fs_state(roots):
    # Every path on the writable file systems (see _corrgrpo_entry); directories of other
    # mounts are not entered.
    state = {}
    def walk(path, dev):
        try:
            entries = list(os.scandir(path))
        except PermissionError:
            return  # a folder the program made unreadable: removed as a whole
        for entry in entries:
            st = entry.stat(follow_symlinks=False)
            is_dir = (st.st_mode & 0o170000) == 0o040000
            # another mount's root: its contents are that mount's business (a root of its own
            # when writable)
            state[entry.path] = _corrgrpo_entry(st, entry.path) if st.st_dev == dev else \
                (st.st_mode, st.st_uid, st.st_gid, 0, None, ())
            if len(state) > 10000:
                raise OSError("too many files to clean")
            if is_dir and st.st_dev == dev:
                walk(entry.path, dev)
    for root in roots:
        st = os.lstat(root)
        state[root] = _corrgrpo_entry(st, root)
        walk(root, st.st_dev)
    return state


def _corrgrpo_remove(path):
    if os.path.isdir(path) and not os.path.islink(path):
        os.chmod(path, 0o700)
        for entry in os.scandir(path):
            _corrgrpo_remove(entry.path)
        os.rmdir(path)
    else:
        os.unlink(path)


def _corrgrpo_clean(roots, snapshot):
    # Put the writable file systems back as they were at start-up (the program's folder,
    # anything it wrote in /tmp, /dev/shm...) and check that no System V IPC object is left;
    # anything that cannot be undone makes the server quit (the host starts a new one).
    try:
        now = _corrgrpo_fs_state(roots)
        if now == snapshot:
            return _corrgrpo_no_ipc()
        for path in now:
            if path not in snapshot and os.path.dirname(path) in snapshot:
                _corrgrpo_remove(path)
        for path, was in snapshot.items():  # extended attributes, then modification times
            if path in now and now[path][5] != was[5]:
                for name, _ in now[path][5]:
                    os.removexattr(path, name, follow_symlinks=False)
                for name, value in was[5]:
                    os.setxattr(path, name, value, follow_symlinks=False)
        for path in sorted(snapshot, key=len, reverse=True):
            st = os.lstat(path)
            if snapshot[path][4] not in (None, st.st_mtime_ns) and not os.path.islink(path):
                os.utime(path, ns=(st.st_atime_ns, snapshot[path][4]))
        return _corrgrpo_fs_state(roots) == snapshot and _corrgrpo_no_ipc()
    except (OSError, RecursionError, ValueError):
        return False


def _corrgrpo_self_state(numbers):
    # What a program could change about the server, and so about every later child (a child
    # inherits them at fork): where the kernel lets a process of the server's uid with no more
    # capabilities than the server act on it (docker: the same uid, no capabilities at all), a
    # program reaches, for each of the server's threads (setpriority, ioprio_set and
    # sched_setaffinity take thread ids; PRIO_USER and IOPRIO_WHO_USER reach them all), its
    # nice value, I/O priority, scheduling policy and priority and CPU affinity, and for the
    # process its resource limits (prlimit). Also compared: its timer slack (CAP_SYS_NICE to
    # change from outside), whether anything traces it or could (its tracer and dumpable flag),
    # its filters and identity. (Its /proc files, such as oom_score_adj, belong to root while it
    # is not dumpable: no program writes them.)
    import resource
    ctypes, libc = _corrgrpo_libc()
    threads = {}
    for name in sorted(os.listdir("/proc/self/task")):
        tid = int(name)
        threads[tid] = (os.getpriority(os.PRIO_PROCESS, tid), _corrgrpo_ioprio(numbers, tid),
                        os.sched_getscheduler(tid), os.sched_getparam(tid).sched_priority,
                        tuple(sorted(os.sched_getaffinity(tid))))
    limits = [(n, resource.getrlimit(getattr(resource, n))) for n in sorted(dir(resource))
              if n.startswith("RLIMIT_")]
    with open("/proc/self/status") as f:
        tracer = [line for line in f if line.startswith(("TracerPid:", "NoNewPrivs:", "Seccomp:"))]
    return (threads, limits, tracer, libc.prctl(3, 0, 0, 0, 0),  # PR_GET_DUMPABLE
            libc.prctl(30, 0, 0, 0, 0),  # PR_GET_TIMERSLACK
            os.getresuid(), os.getresgid(), os.getgroups())


def _corrgrpo_ioprio(numbers, tid, value=None):
    # ioprio_get/ioprio_set(IOPRIO_WHO_PROCESS, tid[, value]); None where the call is missing
    ctypes, libc = _corrgrpo_libc()
    try:
        nr = _corrgrpo_syscall_nr("ioprio_get" if value is None else "ioprio_set", numbers)
    except OSError:
        return None
    args = [ctypes.c_long(nr), ctypes.c_long(1), ctypes.c_long(tid)]
    if value is not None:
        args.append(ctypes.c_long(value))
    result = libc.syscall(*args)
    if value is not None and result < 0:
        raise OSError(ctypes.get_errno(), "ioprio_set")
    return result


def _corrgrpo_restore_self(numbers, state):
    # Put back what a process may set again on itself without a capability: each thread's I/O
    # priority (a best-effort or idle class), CPU affinity (within its cpuset) and a policy of
    # SCHED_BATCH back to SCHED_OTHER, and soft resource limits up to the hard ones. A raised
    # nice value, SCHED_IDLE or a lowered hard limit need a capability (or RLIMIT_NICE) the
    # server does not have: the comparison that follows fails and the server quits.
    import resource
    threads, limits = state[0], state[1]
    for tid, (nice, ioprio, policy, priority, cpus) in threads.items():
        for restore in ("ioprio", "affinity", "policy", "nice"):
            try:
                if restore == "ioprio" and ioprio is not None:
                    _corrgrpo_ioprio(numbers, tid, ioprio)
                elif restore == "affinity":
                    os.sched_setaffinity(tid, cpus)
                elif restore == "policy":
                    os.sched_setscheduler(tid, policy, os.sched_param(priority))
                elif restore == "nice":
                    os.setpriority(os.PRIO_PROCESS, tid, nice)
            except OSError:
                pass
    for name, value in limits:
        try:
            resource.setrlimit(getattr(resource, name), value)
        except (OSError, ValueError):
            pass


def _corrgrpo_self_restored(numbers, state):
    # Whether the server is as it was at start-up, once put back where it can be (a thread
    # that vanished while being read: not as it was).
    try:
        if _corrgrpo_self_state(numbers) == state:
            return True
        _corrgrpo_restore_self(numbers, state)
        return _corrgrpo_self_state(numbers) == state
    except OSError:
        return False


def _corrgrpo_kernel_state(uid):
    # Kernel objects a program could leave for the next one outside its namespaces: the keys
    # its uid owns (/proc/key-users: keys, instantiated keys, quota in keys and bytes; the
    # user and user-session keyrings of a uid outlive its processes) and the unix sockets of
    # the server's network namespace (an abstract socket kept alive by a descriptor cycle).
    keys = (0, 0, 0, 0)  # keys, instantiated keys, keys and bytes counted against the quota
    try:
        with open("/proc/key-users") as f:
            for line in f:
                head, _, rest = line.partition(":")
                if head.strip() == str(uid):
                    # "<uid>: <usage> <keys>/<instantiated> <quota keys>/<max> <bytes>/<max>"
                    counts = [part.split("/") for part in rest.split()[1:4]]
                    keys = (int(counts[0][0]), int(counts[0][1]), int(counts[1][0]),
                            int(counts[2][0]))
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open("/proc/net/unix") as f:
            sockets = frozenset(line.split()[6] for line in list(f)[1:] if len(line.split()) > 6)
    except OSError:
        sockets = frozenset()
    return keys, sockets


#: What three anonymous session keyrings ("_ses", 5 bytes each) count in /proc/key-users.


_PENDING_KEYRINGS = (3, 3, 3, 15)


def _corrgrpo_kernel_settled(uid, start, time):
    # The kernel frees a dead program's session keyring (after an RCU grace period, some
    # 60 ms) and its sockets asynchronously, so the keyrings of the last few programs may
    # still be counted. A key that outlives its program needs a keyring of the uid that
    # outlives it too: the user and user-session keyrings ("_uid.<uid>", "_uid_ses.<uid>",
    # 2 keys, 26 bytes for uid 65534) or the persistent one ("_persistent.<uid>", 18 bytes
    # for uid 65534, more for larger uids), more than three session keyrings' bytes. So up
    # to that much counts as settled; beyond it the server waits, and anything more half a
    # second later makes it quit.
    deadline = time.monotonic() + 0.5
    while True:
        keys, sockets = _corrgrpo_kernel_state(uid)
        extra = [now - was for now, was in zip(keys, start[0])]
        if all(e <= room for e, room in zip(extra, _PENDING_KEYRINGS)) and sockets <= start[1]:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.002)


def _corrgrpo_no_ipc():
    for name in ("shm", "sem", "msg"):
        try:
            with open("/proc/sysvipc/" + name) as f:
                if len(f.read().splitlines()) > 1:
                    return False
        except OSError:
            pass
    return True
