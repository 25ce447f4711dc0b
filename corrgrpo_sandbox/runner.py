"""The program texts sent into a sandbox: the runner and the fork server.

The runner (:data:`RUNNER_SOURCE`) is passed to a fresh ``python -I -S -c`` and reads, from standard input, one
header line (a Python literal) and then the program's source. It applies the isolation that
must happen inside the new process (private mounts, dropped capabilities,
resource limits), runs the program with ``exec`` and reports the outcome on a
separate status channel, tagged with a one-time token so that printing or exiting
early does not read as a pass. A program that starts with a calls directive
(:mod:`corrgrpo_sandbox.calls`) also has its entry called on the given
inputs, one record per call on that channel; those records are all the host
judges (the program can reach the channel, so nothing there is trusted).

Both are joined from the modules of :mod:`corrgrpo_sandbox.inside` (read as package
resources) because they run in an interpreter that cannot import this package (``-S`` drops
site-packages): the codec (:mod:`~corrgrpo_sandbox.inside.plain`) and the bootstrap
(:mod:`~corrgrpo_sandbox.inside.boot`), then the call that starts it.

:data:`SERVER_SOURCE` is the long-lived variant: a fork server that isolates
itself once, preloads common standard-library modules, and then forks one child
per program (:mod:`~corrgrpo_sandbox.inside.server`, with what it restores after each:
:mod:`~corrgrpo_sandbox.inside.server_state`); the child runs the very same bootstrap as the
fresh runner. See
:mod:`corrgrpo_sandbox.forkserver` for the protocol and the host side.
"""

from __future__ import annotations

from corrgrpo_sandbox.inside import program_text

__all__ = ["RUNNER_SOURCE", "SERVER_DEFINITIONS", "SERVER_SOURCE", "PRELOAD_MODULES", "STATUS_OK",
           "STATUS_ASSERTION"]

STATUS_OK = "ok"
STATUS_ASSERTION = "assertion"

#: Standard-library modules the fork server imports once, before any program
#: (what judged programs commonly import; each child gets them for free).
PRELOAD_MODULES = (
    "abc", "array", "bisect", "collections", "collections.abc", "copy", "dataclasses",
    "datetime", "decimal", "enum", "fractions", "functools", "hashlib", "heapq", "io",
    "itertools", "json", "math", "operator", "random", "re", "resource", "statistics",
    "string", "threading", "time", "typing",
)

#: The fresh runner: one program, then the interpreter exits.
RUNNER_SOURCE = program_text("plain", "boot", run="_corrgrpo_boot()")

# The fork server. argv: the control socket's fd and the server's config (a Python
# literal). Protocol on the SOCK_SEQPACKET control socket:
#   server -> host  b"ready"                      once isolated and preloaded
#   host -> server  b"R <timeout>" + 4 fds        stdin, stdout, stderr, status of one program
#   host -> server  b"K"                          kill the running program (output cap hit)
#   server -> host  b"D <kind> <code> <clean> <cpu_ns>"
#                                                 kind: exit, timeout or killed; code: exit
#                                                 code (negative: signal); clean 0: the server
#                                                 could not restore a clean state and exits;
#                                                 cpu_ns: CPU time of the program's control
#                                                 group, -1 without one
# The program itself (header and source) travels on its stdin pipe straight to the child,
# so the server never holds a program's text or output.

#: The fork server's program without the call that starts it (the docker relay runs it in
#: its own process).
SERVER_DEFINITIONS = program_text("plain", "boot", "server_state", "server")

SERVER_SOURCE = SERVER_DEFINITIONS + "\n_corrgrpo_serve()\n"
