"""The docker backend's parts that need no engine: the system-call filter it stacks on the
engine's profile, and what it says when the Docker SDK or the engine is missing."""

from __future__ import annotations

import struct
import sys

import pytest

from corrgrpo_sandbox import SandboxUnavailable
from corrgrpo_sandbox import docker as docker_backend
from corrgrpo_sandbox.seccomp import CLONE_NEWUSER, DENIED
from corrgrpo_sandbox.syscall_filter import (
    canonical_machine,
    denial_filter,
    filter_architectures,
    runner_syscall_numbers,
    syscall_numbers,
)

_ALLOW = struct.pack("<HBBI", 0x06, 0, 0, 0x7FFF0000)
_EPERM = struct.pack("<HBBI", 0x06, 0, 0, 0x00050001)


def _rules(machine: str) -> list[tuple[int, int, int, int]]:
    program = denial_filter(machine)
    return [struct.unpack("<HBBI", program[i : i + 8]) for i in range(0, len(program), 8)]


@pytest.mark.parametrize("machine", ["x86_64", "amd64", "aarch64", "arm64"])
def test_the_filter_denies_each_call_and_allows_the_rest(machine):
    program = denial_filter(machine)
    assert len(program) % 8 == 0 and len(program) // 8 < 4096  # the kernel's BPF_MAXINSNS
    assert program[-8:] == _ALLOW and program[16:24] == _EPERM  # other ABIs: denied
    rules = _rules(machine)
    numbers = syscall_numbers(machine)
    # every denied call the machine has (aarch64 has no inotify_init): "nr == N: return EPERM"
    assert set(DENIED) - set(numbers) <= {"inotify_init"}
    for name in set(DENIED) & set(numbers) - {"clone", "unshare", "clone3"}:
        index = rules.index((0x15, 0, 1, numbers[name]))
        assert rules[index + 1] == struct.unpack("<HBBI", _EPERM), name
    index = rules.index((0x15, 0, 1, numbers["clone3"]))  # ENOSYS
    assert rules[index + 1] == (0x06, 0, 0, 0x00050026)
    for name in ("clone", "unshare"):  # the flags word is tested for CLONE_NEWUSER
        index = rules.index((0x15, 0, 4, numbers[name]))
        assert rules[index + 2] == (0x45, 0, 1, CLONE_NEWUSER)


def test_the_filter_knows_its_machines():
    assert set(filter_architectures()) == {"x86_64", "aarch64"}
    assert canonical_machine("amd64") == "x86_64" and canonical_machine("arm64") == "aarch64"
    assert syscall_numbers("x86_64")["io_uring_setup"] == syscall_numbers("aarch64")["io_uring_setup"]
    with pytest.raises(ValueError, match="s390x"):
        denial_filter("s390x")
    assert runner_syscall_numbers("amd64") == {"keyctl": 250, "ioprio_set": 251, "ioprio_get": 252}
    assert runner_syscall_numbers("aarch64")["ioprio_get"] == 31


def test_a_missing_sdk_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "docker", None)  # import docker -> ImportError
    with pytest.raises(SandboxUnavailable, match=r"pip install 'corrgrpo\[docker\]'"):
        docker_backend._client(None)
    monkeypatch.setattr(docker_backend, "_CHECKED", {})
    ok, reason = docker_backend.docker_available("corrgrpo/python:bookworm")
    assert not ok and "Docker SDK for Python is not installed" in reason


def test_engine_errors_keep_the_engine_message():
    docker = pytest.importorskip("docker", reason="the Docker SDK is not installed")
    response = type("Response", (), {"status_code": 409, "reason": "Conflict"})()
    error = docker_backend._engine_error(
        "tcp://10.0.0.7:2375", docker.errors.APIError("409 Client Error", response,
                                                      explanation="removal already in progress"))
    assert isinstance(error, SandboxUnavailable) and error.status_code == 409
    assert str(error) == "docker engine tcp://10.0.0.7:2375 (409): removal already in progress"


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_the_numbers_are_libseccomps(machine):
    """The tables the filter and the runner use for an engine's machine agree with libseccomp's."""
    pyseccomp = pytest.importorskip("pyseccomp", reason="pyseccomp is not installed")
    arch = {"x86_64": pyseccomp.Arch.X86_64, "aarch64": pyseccomp.Arch.AARCH64}[machine]
    numbers = {**syscall_numbers(machine), **runner_syscall_numbers(machine)}
    assert numbers == {name: int(pyseccomp.resolve_syscall(arch, name)) for name in numbers}
