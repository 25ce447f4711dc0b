"""The code domain's attack classes: its reward, its sandbox and its host-side judge.

Registered in :mod:`corrgrpo_envs.redteam.registry` on import: forged verdicts through the
code env, CPU-time tricks, bombs, the network, host secrets, kernel state a program could leave
behind (keyrings, sockets, process attributes), the seccomp filter's denials, and the judge
probes of :mod:`corrgrpo_envs.code.judge_probes`.
"""

from __future__ import annotations

import ast
import ctypes
import json
import os
import socket
import textwrap
import uuid
from collections.abc import Callable
from pathlib import Path

from corrgrpo_envs.redteam.registry import LIMITS, Target, register

__all__ = ["HIDDEN_WORK_PLACES", "WORK"]

# ------------------------------------------------------------------ the code env's verdicts
_TASK = {"task_id": "add", "prompt": "", "entry_point": "add",
         "solution": "def add(a, b):\n    return a + b\n",
         "test": "def check(candidate):\n" + "".join(
             f"    assert candidate({a}, {b}) == {a + b}\n" for a, b in [(1, 2), (5, -3), (10, 20)])}

_ANSWERS = {
    "spoofed_status": '''
import os
_real_write = os.write
def _forged(fd, data):
    if fd > 2:
        data = data.lstrip(b"\\n").split(b" ", 1)[0] + b" ok 0.000001\\n"
    return _real_write(fd, data)
os.write = _forged
def add(a, b):
    return None
''',
    "frame_walk": '''
def add(a, b):
    import sys, os
    frame = sys._getframe()
    while frame is not None:
        if "report" in frame.f_locals:
            frame.f_locals["report"]("ok", 0.0)
            os._exit(0)
        frame = frame.f_back
''',
    "always_equal": '''
class _Anything:
    def __eq__(self, other): return True
    def __ne__(self, other): return False
    def __hash__(self): return 0
def add(a, b):
    return _Anything()
''',
    "early_exit": "import sys\nsys.exit(0)\ndef add(a, b):\n    return None\n",
}


def _code_env(target: Target, **kwargs):
    from corrgrpo_envs.code.env import CodeEnv

    path = target.folder / "redteam-task.jsonl"
    if not path.exists():
        path.write_text(json.dumps(_TASK) + "\n")
    return CodeEnv(dataset=str(path), backend=target.sandbox, timeout=LIMITS.timeout,
                   reference_cache_dir=target.folder / "refs", reference_runs=1, **kwargs)


def _answer(code: str) -> str:
    return f"```python\n{textwrap.dedent(code).strip()}\n```"


def _forged_verdict(kind: str) -> Callable[[Target], tuple[bool, str]]:
    def run(target: Target) -> tuple[bool, str]:
        env = _code_env(target, efficiency="off")
        rewards, info = env.score("add", _answer(_ANSWERS[kind]))
        reference, _ = env.score("add", env.reference_action("add")[0])
        held = rewards["correct"] == 0.0 and reference["correct"] == 1.0
        return held, f"correct={rewards['correct']:.0f} (status {info.get('status')}), " \
                     f"reference correct={reference['correct']:.0f}"
    return run


for _kind, _description in [
    ("spoofed_status", "rewrites what goes to the status channel so that it reads 'ok'"),
    ("frame_walk", "walks up to the runner's reporter, reports 'ok' and leaves"),
    ("always_equal", "returns an object equal to everything"),
    ("early_exit", "leaves with sys.exit(0) before any call"),
]:
    register(_kind, _description)(_forged_verdict(_kind))


#: the CPU-bound work the hidden-CPU-time attack moves around
WORK = '''
def work(n):
    total = 0
    for i in range(n):
        total += i * i % 7
    return total
'''

_SLOW_ANSWER = '''
import time
_start = time.process_time()
while time.process_time() - _start < 0.3:
    pass
for _name in ("perf_counter", "monotonic", "time", "process_time", "thread_time"):
    setattr(time, _name, lambda: 0.0)
    setattr(time, _name + "_ns", lambda: 0)
def add(a, b):
    return a + b
'''


@register("clock_patching", "burns CPU, then replaces every clock the program can see")
def _clock_patching(target: Target) -> tuple[bool, str]:
    env = _code_env(target)
    rewards, info = env.score("add", _answer(_SLOW_ANSWER))
    if str(info.get("efficiency", "")).startswith("unavailable"):
        return True, f"no number to forge: efficiency is {info['efficiency']}"
    return rewards["correct"] == 1.0 and rewards["efficiency"] == 0.0, \
        f"efficiency={rewards['efficiency']:.2f}, cpu {info.get('exec_seconds')} s " \
        f"vs reference {info.get('reference_seconds')} s"


#: the same work done where each program puts it; each leaves nothing running once it returns
HIDDEN_WORK_PLACES = {
    "main": "work(N)\n",
    "auto_reaped_child": '''
import os, signal, time
signal.signal(signal.SIGCHLD, signal.SIG_IGN)
if os.fork() == 0:
    work(N)
    os._exit(0)
time.sleep(T)
''',
    "double_forked_daemon": '''
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        work(N)
        os._exit(0)
    os._exit(0)
os.wait()
time.sleep(T)
''',
    "thread_pool": '''
from concurrent.futures import ThreadPoolExecutor
with ThreadPoolExecutor(4) as pool:
    list(pool.map(work, [N // 4] * 4))
''',
}


@register("hidden_cpu_time", "does the same work in an auto-reaped child, a double-forked daemon "
          "and a thread pool, hoping for less counted CPU time than in the main process")
def _hidden_cpu(target: Target) -> tuple[bool, str]:
    def cpu(place: str, sleep: float) -> float | None:
        result = target.sandbox.run(WORK + f"N, T = 1000000, {sleep}\n" + textwrap.dedent(HIDDEN_WORK_PLACES[place]))
        if result.status != "ok":
            raise RuntimeError(f"{place}: {result.status} {result.stderr[-200:]}")
        return result.cpu_seconds

    first = cpu("main", 0.0)
    if first is None:
        return True, "no CPU time is reported here (efficiency is unavailable, not forgeable)"
    main = min(first, cpu("main", 0.0) or first)  # the honest time, at its least noisy
    seen = {place: cpu(place, 4 * main + 0.2) for place in HIDDEN_WORK_PLACES if place != "main"}
    # (hiding worked out to about 5 % of the honest time where it could be done)
    hidden = {p: t for p, t in seen.items() if t is None or t < 0.5 * main}
    detail = ", ".join(f"{p} {t if t is None else round(t, 3)} s" for p, t in seen.items())
    return not hidden, f"main {main:.3f} s; {detail}"


# ------------------------------------------------------------------ resource bombs
def _bomb(program: str, expected: str) -> Callable[[Target], tuple[bool, str]]:
    def run(target: Target) -> tuple[bool, str]:
        result = target.sandbox.run(program)
        after = target.sandbox.run("print(6 * 7)")
        held = result.status == expected and after.status == "ok" and after.stdout.strip() == "42"
        return held, f"status {result.status} (expected {expected}); next program {after.status}"
    return run


register("fork_bomb", "forks without end; the next program must still run")(_bomb(
    "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
    "timeout"))
register("memory_bomb", "allocates 10 GB")(_bomb("x = bytearray(10 * 1024 ** 3)\n", "memory"))
register("output_bomb", "prints 1 GB")(_bomb(
    "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n", "output_limit"))
register("infinite_loop", "never returns")(_bomb("while True:\n    pass\n", "timeout"))


# ------------------------------------------------------------------ the host
@register("network", "connects to a port listening on the host's loopback")
def _network(target: Target) -> tuple[bool, str]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    try:
        result = target.sandbox.run(
            f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)\nprint('connected')")
        server.settimeout(0.2)
        try:
            server.accept()
            accepted = True
        except OSError:
            accepted = False
    finally:
        server.close()
    return not accepted and "connected" not in result.stdout, f"status {result.status}"


@register("host_secrets", "reads the host's environment, a home file and /etc/shadow, writes "
          "kernel settings, looks for root")
def _host_secrets(target: Target) -> tuple[bool, str]:
    secret = f"corrgrpo-secret-{uuid.uuid4().hex}"
    home_file = Path.home() / f".corrgrpo-redteam-{uuid.uuid4().hex[:8]}"
    home_file.write_text(secret)
    home_file.chmod(0o600)
    os.environ["CORRGRPO_REDTEAM_SECRET"] = secret
    program = f'''
import glob, json, os
seen, readable, wrote = [repr(dict(os.environ))], [], []
for path in glob.glob("/proc/*/environ") + [{str(home_file)!r}, "/etc/shadow"]:
    try:
        seen.append(open(path, "rb").read().decode("latin-1"))
        readable.append(path)
    except OSError:
        pass
for path in ("/proc/sys/kernel/core_pattern", "/proc/sysrq-trigger"):
    try:
        open(path, "w").write("x")
        wrote.append(path)
    except OSError:
        pass
print(json.dumps({{"seen": "\\n".join(seen), "readable": readable, "wrote": wrote,
                  "uids": list(os.getresuid())}}))
'''
    try:
        result = target.sandbox.run(program)
    finally:
        home_file.unlink()
        os.environ.pop("CORRGRPO_REDTEAM_SECRET", None)
    if result.status != "ok":
        return False, f"status {result.status}: {result.stderr[-200:]}"
    out = json.loads(result.stdout)
    leaked = secret in out["seen"] or "/etc/shadow" in out["readable"]
    root = 0 in out["uids"]
    return not (leaked or out["wrote"] or root), \
        f"secret or /etc/shadow read: {leaked}; kernel settings written: {out['wrote']}; " \
        f"uids {out['uids']}"


# ------------------------------------------------------------------ kernel state
def _syscall(name: str) -> int | None:
    try:
        import pyseccomp
    except (ImportError, OSError, RuntimeError):  # (RuntimeError: libseccomp is missing)
        return None
    return int(pyseccomp.resolve_syscall(pyseccomp.system_arch(), name))


def _key_program(keyctl: int, add_key: int, body: str) -> str:
    return textwrap.dedent(f'''
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    def keyctl(*a):
        return libc.syscall(ctypes.c_long({keyctl}), *[x if isinstance(x, bytes) else ctypes.c_long(x) for x in a])
    def add_key(name, ring):
        return libc.syscall(ctypes.c_long({add_key}), b"user", name, b"v", ctypes.c_size_t(1), ctypes.c_long(ring))
    def search(name):
        hits = [r for r in (-1, -2, -3, -4, -5) if keyctl(10, r, b"user", name, 0) > 0]
        try:
            listed = name.decode() in open("/proc/keys").read()
        except OSError:
            listed = False
        return hits, listed
    ''') + body


@register("keyrings", "reads the host's session keyring; leaves keys in every keyring it can "
          "name for the next program and the host")
def _keyrings(target: Target) -> tuple[bool, str]:
    keyctl, add_key = _syscall("keyctl"), _syscall("add_key")
    if keyctl is None or add_key is None:
        return False, "cannot name keyctl and add_key here (libseccomp missing)"
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    host_name = f"corrgrpo-host-{uuid.uuid4().hex[:8]}".encode()
    # a session keyring of this process only, with a key in it (what a sandbox would inherit)
    if libc.syscall(ctypes.c_long(keyctl), ctypes.c_long(1), None) < 0 or libc.syscall(
            ctypes.c_long(add_key), b"user", host_name, b"v", ctypes.c_size_t(1), ctypes.c_long(-3)) < 0:
        return False, f"cannot make a host key to look for (errno {ctypes.get_errno()})"
    left = f"corrgrpo-left-{uuid.uuid4().hex[:8]}".encode()
    first = target.sandbox.run(_key_program(keyctl, add_key, (
        f"print(search({host_name!r}))\n"
        f"for ring in (-3, -4, -5):\n    add_key({left!r}, ring)\n")))
    second = target.sandbox.run(_key_program(keyctl, add_key, f"print(search({left!r}))\n"))
    host_hits = [r for r in (-1, -2, -3, -4, -5) if libc.syscall(
        ctypes.c_long(keyctl), ctypes.c_long(10), ctypes.c_long(r), b"user", left, ctypes.c_long(0)) > 0]
    held = (first.status == second.status == "ok" and "([], False)" in first.stdout
            and "([], False)" in second.stdout and not host_hits)
    return held, f"host key seen by a program: {first.stdout.strip() or first.status}; key left " \
                 f"seen by the next: {second.stdout.strip() or second.status}; by the host: {host_hits}"


@register("abstract_socket", "keeps an abstract unix socket alive by a descriptor cycle for the "
          "next program and the host")
def _abstract_socket(target: Target) -> tuple[bool, str]:
    name = f"corrgrpo-sock-{uuid.uuid4().hex[:8]}"
    first = target.sandbox.run(textwrap.dedent(f'''
    import array, socket
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind("\\0{name}")
    s.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [s.fileno()]))], 0, "\\0{name}")
    '''))
    second = target.sandbox.run(textwrap.dedent(f'''
    import socket
    try:
        socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).sendto(b"y", "\\0{name}")
        print("reached")
    except OSError:
        print("absent")
    '''))
    host = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        host.sendto(b"z", "\0" + name)
        host_reached = True
    except OSError:
        host_reached = False
    finally:
        host.close()
    held = first.status == "ok" and second.stdout.strip() == "absent" and not host_reached
    return held, f"bound: {first.status}; next program: {second.stdout.strip() or second.status}; " \
                 f"host reached it: {host_reached}"


@register("nested_capabilities", "makes each system call the seccomp filter denies (a user "
          "namespace, keys, io_uring, userfaultfd, perf events, bpf, mounts)")
def _nested_capabilities(target: Target) -> tuple[bool, str]:
    from corrgrpo_sandbox.seccomp import DENIED, seccomp_unavailable_reason

    if seccomp_unavailable_reason():
        return False, f"no seccomp filter: {seccomp_unavailable_reason()}"
    numbers = {name: _syscall(name) for name in DENIED}
    calls = {  # arguments that would do something without the filter
        "unshare": "0x10000000", "clone": "0x10000011, 0, 0, 0, 0",
        "mount": 'b"none", b"/tmp", b"tmpfs", 0, None', "umount2": 'b"/tmp", 2',
        "keyctl": "0, -3, 1", "add_key": 'b"user", b"k", b"v", 1, -3',
        "pivot_root": 'b"/tmp", b"/tmp"', "userfaultfd": "0", "fsopen": 'b"tmpfs", 0',
        "open_tree": '-100, b"/tmp", 1',
    }
    body = "out = {}\n"
    for name, args in calls.items():
        body += (f"r = libc.syscall(ctypes.c_long({numbers[name]}), *[a if a is None or isinstance(a, bytes) "
                 f"else ctypes.c_long(a) for a in ({args},)])\n"
                 f"if r == 0 and {name!r} == 'clone':\n    os._exit(0)\n"
                 f"out[{name!r}] = 'OK' if r >= 0 else errno.errorcode.get(ctypes.get_errno(), '?')\n")
    program = ("import ctypes, errno, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
               "libc.syscall.restype = ctypes.c_long\n" + body + "print(out)\n")
    return _every_call_denied(target, program)


def _every_call_denied(target: Target, program: str) -> tuple[bool, str]:
    """Run ``program`` (it prints ``{call: "OK" | "made" | errno name}``); held when every call got EPERM."""
    result = target.sandbox.run(program)
    if result.status != "ok":
        return False, f"status {result.status}: {result.stderr[-200:]}"
    out = ast.literal_eval(result.stdout.strip())
    allowed = sorted(name for name, code in out.items() if code != "EPERM")
    return not allowed, "every call got EPERM" if not allowed else f"not denied: {allowed} ({out})"


@register("foreign_abi", "makes unshare(CLONE_NEWUSER) through the i386 system-call ABI "
          "(int 0x80), whose numbers a filter written for x86_64's would not match")
def _foreign_abi(target: Target) -> tuple[bool, str]:
    if os.uname().machine != "x86_64":
        return True, f"no i386 ABI to try on {os.uname().machine}"
    program = textwrap.dedent('''
    import ctypes, mmap
    # push rbx; mov eax, 310 (i386 unshare); mov ebx, CLONE_NEWUSER; int 0x80; pop rbx; ret
    code = bytes.fromhex("53b836010000bb00000010cd805bc3")
    page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    page.write(code)
    print("unshare", ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(page)))())
    ''')
    result = target.sandbox.run(program)
    got_through = "unshare 0" in result.stdout
    return not got_through, f"status {result.status}; {result.stdout.strip() or 'no output'}"


@register("file_watches", "watches (inotify, fanotify) the host folders every sandbox binds, to "
          "see which files a concurrent program opens")
def _file_watches(target: Target) -> tuple[bool, str]:
    # The calls through the C library (on every machine: aarch64's glibc makes inotify_init
    # an inotify_init1). Without the filter, inotify_init1 succeeds and a watch on the json
    # folder of the standard library sees a concurrent program import from it.
    program = textwrap.dedent('''
    import ctypes, errno
    libc = ctypes.CDLL(None, use_errno=True)
    out = {}
    for name, call in (("inotify_init", lambda: libc.inotify_init()),
                       ("inotify_init1", lambda: libc.inotify_init1(0)),
                       ("inotify_add_watch", lambda: libc.inotify_add_watch(0, b"/tmp", 0x20)),
                       ("fanotify_init", lambda: libc.fanotify_init(0x200, 0)),
                       ("fanotify_mark", lambda: libc.fanotify_mark(0, 1, ctypes.c_uint64(0x20),
                                                                    -100, b"/tmp"))):
        ctypes.set_errno(0)
        out[name] = "made" if call() >= 0 else errno.errorcode.get(ctypes.get_errno(), "?")
    print(out)
    ''')
    return _every_call_denied(target, program)


@register("carried_attributes", "changes each process attribute (nice value, I/O priority, "
          "scheduling, affinity, limits, umask, environment, signals, timers, control group, "
          "keyrings...) on itself, its fork server, its process group and its uid, one program "
          "each; the next program must start as the one before did")
def _carried_attributes(target: Target) -> tuple[bool, str]:
    from corrgrpo_sandbox import carryover

    report = carryover.check(target.sandbox, separately=True)
    others = {"parent", "pid 1", "parent group", "uid"}
    reached = sorted(name for name, where in report.accepted().items() if others & set(where))
    carried = {name: values[1:] for name, values in report.carried.items()}
    return not carried, f"{len(carryover.ATTRIBUTES)} attributes; changes let through to the " \
        f"server, its group or the uid: {', '.join(reached) or 'none'}; carried to the next " \
        f"program: {carried or 'none'}"


# ------------------------------------------------------------------ the host-side judge
def _judge_probe(probe: Callable[..., tuple[bool, str]]) -> Callable[[Target], tuple[bool, str]]:
    """A judge probe run through a code env on the target's backend."""
    return lambda target: probe(backend=target.backend)


def _register_judge_probes() -> None:
    from corrgrpo_envs.code import judge_probes

    for name, probe in judge_probes.PROBES.items():
        doc = (probe.__doc__ or name).strip().splitlines()[0]
        label = name if name.startswith("judge") else f"judge_{name}"
        register(label, f"host-side judge: {doc}")(_judge_probe(probe))


_register_judge_probes()
