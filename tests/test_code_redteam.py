"""``corrgrpo code redteam``: every attack class held on this machine, printed per class; a
broken or failing class makes the command exit with 1; the registry takes new classes and
sandbox-free probes."""

from __future__ import annotations

import argparse
import sys

import pytest

from corrgrpo_envs.code.commands import run
from corrgrpo_envs.redteam import channels, code_domain  # noqa: F401 - register the code domain's classes
from corrgrpo_envs.redteam import registry as redteam
from corrgrpo_sandbox.bwrap import bwrap_unavailable_reason
from corrgrpo_sandbox.docker import docker_available


def _records(out: str) -> list[str]:
    """The report's lines with each class's indented continuation lines joined to it."""
    records: list[str] = []
    for line in out.splitlines():
        if line.startswith(" ") and records:
            records[-1] += " " + line.strip()
        else:
            records.append(line)
    return records


def _args(**kwargs) -> argparse.Namespace:
    return argparse.Namespace(**{"code_command": "redteam", "backend": "process", "only": None,
                                 "list": False, **kwargs})


def test_every_attack_class_holds_on_the_process_backend(capsys, probe_budget):
    from corrgrpo_envs.redteam import register_domains

    register_domains()  # every domain's classes, as the command registers them
    # (probe_budget: the judge probes' 1 s of host CPU, scaled to this machine's load)
    # the OpenEnv boundary's classes run in a process of their own (tests/test_redteam_openenv.py)
    names = [a.name for a in redteam.ATTACKS if not a.name.startswith("openenv_")]
    code = run(_args(only=names))
    text = capsys.readouterr().out
    assert max(map(len, text.splitlines())) <= 100, text
    out = _records(text)
    assert code == 0, [line for line in out if not line.startswith("held")]
    for name in names:
        assert any(line.split()[:2] == ["held", name] for line in out), (name, out)
    assert out[-1] == f"{len(names)} of {len(names)} attack classes held"
    # the host-side judge's and AgentDojo's attacks are classes too
    assert {"judge_shared_tuple_dag", "judge_deadline", "agentdojo_pasted_tool_outputs"} <= set(names)


#: The sandbox's kernel-level classes, run on the other backends too.
SANDBOX_CLASSES = ["hidden_cpu_time", "keyrings", "abstract_socket", "nested_capabilities",
                   "file_watches", "carried_attributes", "spoofed_status", "dnotify_channel",
                   "file_lock_channel", "proc_locks", "page_cache_channel", "ipc_channel",
                   "shared_file_marks"]


@pytest.mark.skipif(bool(bwrap_unavailable_reason()), reason=f"bwrap: {bwrap_unavailable_reason()}")
def test_the_new_attack_classes_hold_on_bwrap(capsys):
    assert run(_args(backend="bwrap", only=SANDBOX_CLASSES)) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    assert out.count("held ") == len(SANDBOX_CLASSES) and "BROKEN" not in out


@pytest.mark.skipif(bool(docker_available()[1]), reason=f"docker: {docker_available()[1]}")
def test_the_sandbox_classes_hold_on_docker(capsys):
    """Docker's fork server shares its programs' uid and has no capability: the changes reach it
    (carried_attributes names them) and none reaches the next program."""
    code = run(_args(backend="docker", only=SANDBOX_CLASSES))
    out = capsys.readouterr().out
    assert code == 0 and out.count("held ") == len(SANDBOX_CLASSES), out
    (line,) = [ln for ln in _records(out) if ln.split()[1:2] == ["carried_attributes"]]
    assert "io_priority" in line and line.endswith("carried to the next program: none"), line


def test_list_names_every_class(capsys):
    assert run(_args(list=True)) == 0
    out = capsys.readouterr().out
    for attack in redteam.ATTACKS:
        assert attack.name in out and attack.description[:30] in out


def test_a_broken_or_failing_class_makes_the_command_fail(capsys, monkeypatch):
    monkeypatch.setattr(redteam, "ATTACKS", list(redteam.ATTACKS))

    def fails(target):
        raise RuntimeError("no luck")

    redteam.register("always_broken", "a defence that does not hold")(lambda t: (False, "it broke"))
    redteam.register("always_failing", "an attack that cannot run")(fails)
    redteam.register_probe("judge_probe", "a probe without a sandbox", lambda: (True, "bounded"))
    with pytest.raises(ValueError, match="registered twice"):
        redteam.register("judge_probe", "again")(lambda t: (True, ""))
    code = run(_args(only=["always_broken", "always_failing", "judge_probe", "network"]))
    out = _records(capsys.readouterr().out)
    assert code == 1
    assert out[0].startswith("held    network")
    assert out[1].startswith("BROKEN  always_broken") and out[1].endswith("it broke")
    assert out[2].startswith("BROKEN  always_failing") and "no luck" in out[2]
    assert out[3].startswith("held    judge_probe") and out[3].endswith("bounded")
    assert out[-1] == "2 of 4 attack classes held; broken: always_broken, always_failing"


def test_a_modules_probe_functions_become_classes(monkeypatch):
    import types

    monkeypatch.setattr(redteam, "ATTACKS", list(redteam.ATTACKS))
    module = types.ModuleType("probes")

    def probe_judge_bound():
        """A huge record is rejected within the bound.

        More words."""
        return True, "rejected in 0.01 s"

    module.probe_judge_bound = probe_judge_bound
    module.helper = lambda: (False, "not a probe")
    assert redteam.register_probes(module) == ["judge_bound"]
    (attack,) = [a for a in redteam.ATTACKS if a.name == "judge_bound"]
    assert attack.description == "A huge record is rejected within the bound."
    assert attack.run(None) == (True, "rejected in 0.01 s")


def test_unknown_classes_are_named():
    with pytest.raises(ValueError, match="unknown attack classes"):
        redteam.run_attacks("process", ["no_such_attack"])


def test_a_class_whose_optional_part_is_absent_is_skipped(capsys, monkeypatch):
    """Without AgentDojo (a default set-up) its classes are skipped with the command that
    installs it, the exit status counts only the classes that ran, and every line fits 100
    columns."""
    monkeypatch.setitem(sys.modules, "agentdojo", None)  # import agentdojo -> ImportError
    from corrgrpo_envs.redteam.agentdojo_domain import PASTE_PROBES, register_paste_probes

    register_paste_probes()
    names = [f"agentdojo_{name}" for name in PASTE_PROBES]
    code = run(_args(only=[*names, "network"]))
    text = capsys.readouterr().out
    assert code == 0 and max(map(len, text.splitlines())) <= 100, text
    out = _records(text)
    for name in names:
        (line,) = [ln for ln in out if ln.split()[1:2] == [name]]
        assert line.startswith("skipped") and line.endswith(
            "agentdojo is not installed: pip install 'corrgrpo[agentdojo]'"), line
    assert out[-1] == "1 of 1 attack classes held; 4 skipped (optional parts not installed)"


def test_absent_openenv_classes_are_named_with_their_install_command(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "agentdojo", None)
    monkeypatch.setitem(sys.modules, "openenv", None)
    monkeypatch.setattr(redteam, "ATTACKS", [])  # only what register_domains adds: AgentDojo's
    assert run(_args()) == 0
    text = capsys.readouterr().out
    assert max(map(len, text.splitlines())) <= 100, text
    out = _records(text)
    assert [line.split()[0] for line in out[:4]] == ["skipped"] * 4
    assert out[4].startswith("skipped OpenEnv classes (openenv_server_*, openenv_client_*) absent")
    assert out[4].endswith("pip install 'corrgrpo[openenv]' && pip install --no-deps openenv==0.10.0")
    assert out[5] == "0 of 0 attack classes held; 4 skipped (optional parts not installed)"


def test_long_details_wrap_under_their_class():
    from corrgrpo_envs.redteam.command import outcome_lines

    detail = " ".join(f"word{i}" for i in range(60))
    lines = outcome_lines(redteam.Outcome("some_class", True, detail, 1.25))
    assert lines[0].startswith("held    some_class") and " 1.2 s  word0 " in lines[0]
    assert all(len(line) <= 100 for line in lines) and len(lines) == 6
    assert all(line.startswith("        word") for line in lines[1:])
    assert " ".join(line.strip() for line in lines).endswith(detail)
