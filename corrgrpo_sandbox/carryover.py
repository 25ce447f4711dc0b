"""Process attributes one sandboxed program could change and a later program read.

Programs of one fork server are forked from it and inherit what it is (nice value, I/O
priority, limits...), and every program of a sandbox shares its kernel objects (a control
group, a uid's keyrings). So a program that changes one of those on its fork server, the
server's process group, its uid or its control group hands the change to the next program: a
channel between programs, and a way to slow or starve them. Each :class:`Attribute` here is
one such attribute, with two functions of the probe module that run inside the sandbox
(:mod:`corrgrpo_sandbox.inside.carryover_probes`):

* ``change_<name>()`` tries to change it on every target the system call allows: the program itself
  (which must not matter), its parent (the fork server, or a fresh run's first process), pid 1
  of the sandbox, the parent's process group and every process of the program's uid; it
  records, per target, ``changed`` or the errno the kernel answered;
* ``read_<name>()`` reads it as a program sees it at its start.

:func:`change_program` and :func:`read_program` put them together into one program each, and
:func:`check` runs them through one sandbox (read; change, read, for all attributes at once or
one program per attribute) and says which attributes carried (a later read differs).
``tests/sandbox/test_sandbox_carryover.py`` runs it on every backend and reuse mode;
``corrgrpo redteam`` runs it as the attack class ``carried_attributes``.

The programs call a few system calls by number (``ioprio_get``, ``ioprio_set``, ``add_key``):
their table is keyed by the sandbox's own machine (a Docker engine may run on another one);
on a machine it does not know, those attributes read ``error: ENOSYS`` every time.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field

from corrgrpo_sandbox.base import Sandbox
from corrgrpo_sandbox.inside import source

__all__ = ["ATTRIBUTES", "PRELUDE", "Attribute", "CarryReport", "change_program", "check",
           "read_program"]


@dataclass(frozen=True)
class Attribute:
    """One process attribute: ``name``, and how a program could pass it on (``via``). The
    probe module defines ``change_<name>()`` (calls ``attempt(name, target, fn)`` for each
    target) and ``read_<name>()``."""

    name: str
    via: str


#: The probe module's text (:mod:`corrgrpo_sandbox.inside.carryover_probes`) every probe
#: program starts with: ``call(name, *args)`` makes a system call the C library does not wrap
#: (``ioprio_set``, ``ioprio_get``, ``add_key``) and raises ``OSError``; ``prctl``, ``write``,
#: ``text``; ``TARGETS`` names the processes a change can aim at (the parent, pid 1).
PRELUDE = source("carryover_probes")

#: Every attribute, in the order programs change and read them.
ATTRIBUTES: tuple[Attribute, ...] = (
    Attribute("nice", "setpriority on the fork server, its process group or the uid"),
    Attribute("io_priority", "ioprio_set on the fork server, its process group or the uid"),
    Attribute("scheduling", "sched_setscheduler on the fork server"),
    Attribute("cpu_affinity", "sched_setaffinity on the fork server"),
    Attribute("rlimits", "prlimit on the fork server (a child inherits its hard limits)"),
    Attribute("oom_score_adj", "/proc/<pid>/oom_score_adj of the fork server"),
    Attribute("timer_slack", "/proc/<pid>/timerslack_ns of the fork server"),
    Attribute("coredump_filter", "/proc/<pid>/coredump_filter of the fork server"),
    Attribute("process_name", "/proc/<pid>/comm of the fork server"),
    Attribute("autogroup", "/proc/<pid>/autogroup (the scheduler group of a session)"),
    Attribute("cgroup", "the files of the control group the next program runs in"),
    Attribute("keyrings", "keys in the uid's user, user-session or persistent keyrings"),
    Attribute("hostname", "the UTS namespace's host and domain names"),
    Attribute("umask", "the program's own (the next one is forked from the server)"),
    Attribute("cwd", "the program's own"),
    Attribute("environment", "the program's own"),
    Attribute("signals", "the program's own dispositions and mask"),
    Attribute("timers", "the program's own interval and POSIX timers"),
    Attribute("personality", "the program's own execution domain"),
    Attribute("securebits", "the program's own (changing them needs CAP_SETPCAP)"),
    Attribute("capabilities", "the program's own bounding and ambient sets"),
    Attribute("no_new_privs_and_seccomp", "the program's own (filters only stack)"),
    Attribute("process_flags", "the program's own dumpable, THP, speculation, subreaper flags"),
)


def change_program(names: Iterable[str] | None = None) -> str:
    """Program A: tries every change of :data:`ATTRIBUTES` (or of those ``names``), prints
    ``{attribute: {target: outcome}}`` as JSON."""
    calls = "".join(f"change_{a.name}()\n" for a in _chosen(names))
    return PRELUDE + "\n" + calls + "print_changes()\n"


def read_program() -> str:
    """Program B: reads every attribute of :data:`ATTRIBUTES`, prints ``{attribute: value}`` as
    JSON (``error: <errno>`` where a read fails, e.g. ``ENOSYS`` for a call unknown there)."""
    return PRELUDE + f"\nprint_reads({[a.name for a in ATTRIBUTES]!r})\n"


def _chosen(names: Iterable[str] | None) -> list[Attribute]:
    if names is None:
        return list(ATTRIBUTES)
    wanted = list(names)
    unknown = sorted(set(wanted) - {a.name for a in ATTRIBUTES})
    if unknown:
        raise ValueError(f"unknown attributes {unknown}; known: {[a.name for a in ATTRIBUTES]}")
    return [a for a in ATTRIBUTES if a.name in wanted]


@dataclass
class CarryReport:
    """What :func:`check` saw: the attributes before any change, what the kernel answered to
    each change, and each later read with the changes made before it."""

    before: dict
    changes: dict = field(default_factory=dict)
    #: ``(the attributes changed just before, what the next program read)``
    after: list[tuple[list[str], dict]] = field(default_factory=list)

    @property
    def carried(self) -> dict[str, list]:
        """Attributes a later program read differently: ``{name: [before, (changed before the
        read, what it read)...]}`` with only the reads that differ."""
        out: dict[str, list] = {}
        for name, value in self.before.items():
            differ = [(changed, read.get(name)) for changed, read in self.after
                      if read.get(name) != value]
            if differ:
                out[name] = [value, *differ]
        return out

    def accepted(self, target: str | None = None) -> dict[str, list[str]]:
        """Per attribute, the targets where the kernel accepted a change (only ``target``'s,
        when given)."""
        out = {}
        for name, outcomes in self.changes.items():
            hit = [t for t, o in outcomes.items() if o == "changed" and target in (None, t)]
            if hit:
                out[name] = hit
        return out


def check(sandbox: Sandbox, names: Iterable[str] | None = None, separately: bool = False,
          reads_after: int = 1) -> CarryReport:
    """Read every attribute; then let a program change the attributes (all, or those
    ``names``: in one program, or one program each when ``separately``), each followed by
    ``reads_after`` programs that read every attribute again. The programs run through
    ``sandbox`` one after the other, so through one fork server for as long as it stays clean.
    One program per attribute tells them apart: a change the server cannot undo replaces it,
    which would hide, in the same program, a change it could not see. Raises
    :class:`RuntimeError` when a program does not run to the end."""
    def run(program: str) -> dict:
        result = sandbox.run(program)
        if result.status != "ok":
            raise RuntimeError(f"a carry-over probe ended {result.status}: {result.stderr[-400:]}")
        return json.loads(result.stdout)

    chosen = [a.name for a in _chosen(names)]
    report = CarryReport(before=run(read_program()))
    for group in ([[name] for name in chosen] if separately else [chosen]):
        report.changes.update(run(change_program(group)))
        report.after += [(group, run(read_program())) for _ in range(reads_after)]
    return report
