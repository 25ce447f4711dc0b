"""No process attribute one program changes reaches the next program of the same sandbox: nice
value, I/O priority, scheduling, CPU affinity, resource limits, OOM score, timer slack, core-dump
filter, process name, autogroup, control group, keyrings, host name, umask, working folder,
environment, signals, timers, personality, securebits, capabilities, no_new_privs and seccomp,
process flags (``corrgrpo_sandbox.carryover``), on every backend and reuse mode. Program A
tries each on itself, its parent (the fork server), pid 1, the parent's process group and its
uid; the programs before and after it read each."""

from __future__ import annotations

import ast
import json

import pytest

from corrgrpo_sandbox import Limits, carryover
from tests.sandbox.backends import backend_params, open_sandbox

LIMITS = Limits(timeout=10.0, memory_mb=256)

#: What the change does to program A itself where the kernel lets it (every backend): each read
#: must see it in A, or the read would miss a carried change too.
SELF_CHANGED = {"nice", "io_priority", "scheduling", "rlimits", "timer_slack", "process_name",
                "umask", "cwd", "environment", "signals", "timers", "personality",
                "no_new_privs_and_seccomp", "process_flags"}


@pytest.fixture(params=backend_params())
def sandbox(request):
    yield from open_sandbox(request.param, LIMITS)


@pytest.fixture(params=[p for p in backend_params() if p.id.endswith("-fork")])
def forking(request):
    yield from open_sandbox(request.param, LIMITS, need_fork=True)


def test_no_attribute_carries_to_the_next_program(sandbox):
    report = carryover.check(sandbox, reads_after=2)
    assert set(report.before) == {a.name for a in carryover.ATTRIBUTES}
    assert not any(str(v).startswith("error") for v in report.before.values()), report.before
    assert report.carried == {}, (report.carried, report.accepted())
    # (the changes A made on itself: every attribute it could change on itself)
    assert SELF_CHANGED <= set(report.accepted()), report.changes


@pytest.mark.timeout(120)
def test_no_attribute_carries_when_changed_alone(forking):
    """One program per attribute: a change the fork server cannot undo (a nice value it may not
    lower again) replaces it, which must not hide one it could not see (its I/O priority)."""
    report = carryover.check(forking, separately=True)
    assert len(report.after) == len(carryover.ATTRIBUTES)
    assert report.carried == {}, (report.carried, report.accepted())
    if forking.name == "docker":  # the server and its programs share a uid and no capability:
        # the changes reach it (and are undone or replace it)
        for name in ("nice", "io_priority", "scheduling", "cpu_affinity", "rlimits"):
            assert "parent" in report.accepted().get(name, []), (name, report.changes[name])


def test_the_reads_see_what_a_program_changed_on_itself(sandbox):
    """The probe is real: program A's own reads after its changes differ wherever it changed
    itself, so an attribute that carried would show."""
    before = json.loads(sandbox.run(carryover.read_program()).stdout)
    result = sandbox.run(carryover.change_program() + carryover.read_program())
    assert result.status == "ok", result.stderr
    changes, itself = (json.loads(line) for line in result.stdout.splitlines())
    differ = {name for name in before if itself[name] != before[name]}
    assert SELF_CHANGED <= differ, (SELF_CHANGED - differ, changes)
    if len(before["cpu_affinity"]) > 1:  # (one CPU: the affinity cannot change)
        assert "cpu_affinity" in differ


def test_a_report_names_what_carried():
    report = carryover.CarryReport(
        before={"nice": 0, "umask": 18}, changes={"nice": {"parent": "changed", "self": "EPERM"}},
        after=[(["umask"], {"nice": 0, "umask": 18}), (["nice"], {"nice": 19, "umask": 18})])
    assert report.carried == {"nice": [0, (["nice"], 19)]}
    assert report.accepted() == {"nice": ["parent"]} and report.accepted("self") == {}


def test_the_programs_name_every_attribute_once():
    names = [a.name for a in carryover.ATTRIBUTES]
    assert len(names) == len(set(names))
    # the probe module defines one change and one read per attribute, and nothing else
    defined = {node.name for node in ast.parse(carryover.PRELUDE).body
               if isinstance(node, ast.FunctionDef)}
    assert {d for d in defined if d.startswith(("change_", "read_"))} == \
        {f"{kind}_{name}" for name in names for kind in ("change", "read")}
    for attribute in carryover.ATTRIBUTES:
        assert f"\nchange_{attribute.name}()\n" in carryover.change_program(), attribute.name
    assert carryover.read_program().endswith(f"print_reads({names!r})\n")
    compile(carryover.change_program(), "<change>", "exec")
    compile(carryover.read_program(), "<read>", "exec")
    assert "\nchange_umask()" not in carryover.change_program(["nice"])
    with pytest.raises(ValueError, match="unknown attributes"):
        carryover.change_program(["no_such_attribute"])
