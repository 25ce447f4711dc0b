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


def _verdict(program: bytes, audit: int, nr: int, args: tuple[int, ...] = ()) -> int:
    """What a classic BPF seccomp program returns for one call (the opcodes the filter uses)."""
    data = struct.pack("<iI8x", nr, audit) + b"".join(
        struct.pack("<Q", a & (1 << 64) - 1) for a in (*args, *[0] * (6 - len(args))))
    rules = [struct.unpack("<HBBI", program[i : i + 8]) for i in range(0, len(program), 8)]
    pc, acc = 0, 0
    while True:
        code, jt, jf, k = rules[pc]
        if code == 0x20:  # load a word of seccomp_data
            acc = struct.unpack_from("<I", data, k)[0]
        elif code == 0x06:
            return k
        elif code in (0x15, 0x35, 0x45):  # jeq, jge, jset
            taken = {0x15: acc == k, 0x35: acc >= k, 0x45: bool(acc & k)}[code]
            pc += jt if taken else jf
        else:
            raise AssertionError(f"opcode {code:#x}")
        pc += 1


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_the_filter_denies_calls_by_their_arguments(machine):
    """fcntl's lock, lease and notification commands, fadvise's DONTNEED and preadv2's
    RWF_NOWAIT are denied; every other command, advice and flag passes; the upper 32 bits of a
    command (which the kernel drops) change nothing."""
    program, numbers = denial_filter(machine), syscall_numbers(machine)
    audit = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}[machine]
    eperm, allow = 0x00050001, 0x7FFF0000

    def verdict(name: str, *args: int) -> int:
        return _verdict(program, audit, numbers[name], args)

    for command in (5, 6, 7, 36, 37, 38, 1024, 1025, 1026):
        assert verdict("fcntl", 3, command) == eperm, command
        assert verdict("fcntl", 3, (1 << 32) | command) == eperm, command
    for command in (0, 1, 2, 3, 4, 8, 9, 10, 11, 1030, 1031, 1033):  # F_DUPFD... F_SETSIG...
        assert verdict("fcntl", 3, command) == allow, command
    assert verdict("fadvise64", 3, 0, 0, 4) == eperm
    assert [verdict("fadvise64", 3, 0, 0, a) for a in (0, 1, 2, 3, 5)] == [allow] * 5
    assert verdict("preadv2", 3, 0, 1, 0, 0, 0x8) == eperm
    assert verdict("preadv2", 3, 0, 1, 0, 0, 0x8 | 0x1) == eperm
    assert [verdict("preadv2", 3, 0, 1, 0, 0, f) for f in (0, 0x1, 0x2, 0x4)] == [allow] * 4
    for name in ("flock", "io_setup", "io_submit", "cachestat"):
        assert verdict(name, 3, 2) == eperm, name
    assert verdict("unshare", 0x10000000) == eperm and verdict("unshare", 0x20000) == allow
    getpid = {"x86_64": 39, "aarch64": 172}[machine]  # a call the filter does not name
    assert _verdict(program, audit, getpid) == allow
