"""The sandbox interface: statuses, limits, the pool, backend selection."""

from __future__ import annotations

import subprocess
import sys

import pytest

from corrgrpo_sandbox import (
    Limits,
    SandboxDowngrade,
    SandboxPool,
    SandboxUnavailable,
    available_backends,
    make_sandbox,
)
from corrgrpo_sandbox.docker import docker_available

LIMITS = Limits(timeout=2.0)


@pytest.fixture(scope="module", params=["process-fork", "process-fresh", "bwrap-fork", "bwrap-fresh",
                                        "docker-fork", "docker-fresh"])
def sandbox(request):
    backend, reuse = request.param.split("-")
    try:
        box = make_sandbox(backend, LIMITS, reuse=reuse)
    except SandboxUnavailable as exc:
        pytest.skip(f"{backend} backend: {exc}")
    if reuse == "fork" and not box.forking:
        pytest.skip("fork servers need namespaces, unavailable here")
    yield box
    box.close()


@pytest.mark.parametrize(
    "program, status",
    [
        ("x = 1\nassert x == 1\nprint('hi')", "ok"),
        ("assert 1 == 2", "assertion"),
        ("raise ValueError('no')", "error:ValueError"),
        ("def f(:\n  pass", "syntax"),
        ("import sys\nsys.exit(0)", "error:SystemExit"),
        ("import os\nos._exit(0)", "killed"),
        ("import json\nprint(json.dumps([1]))", "ok"),
    ],
)
def test_status_of_each_kind_of_ending(sandbox, program, status):
    result = sandbox.run(program)
    assert result.status == status
    assert result.backend == sandbox.name
    assert result.extra.get("reuse", "fresh") == sandbox.reuse
    assert result.passed == (status == "ok")
    assert result.finished == (status in ("ok", "assertion"))


def test_stdout_stderr_and_exec_time(sandbox):
    result = sandbox.run("import sys, time\nprint('out')\nprint('err', file=sys.stderr)\ntime.sleep(0.2)")
    assert result.stdout == "out\n"
    assert "err" in result.stderr
    # at least the sleep, and less than the deadline (past it the program would have been killed):
    # a number in seconds for the program alone, whatever the load adds to it
    assert 0.19 < result.exec_seconds < LIMITS.timeout
    assert result.wall_seconds >= result.exec_seconds


def test_forged_status_line_does_not_pass(sandbox):
    program = "import os\nfor fd in range(3, 20):\n    try:\n        os.write(fd, b'0' * 32 + b' ok 0.1\\n')\n    except OSError:\n        pass\nos._exit(0)"
    assert sandbox.run(program).status == "killed"


def test_stdlib_available_and_site_packages_not(sandbox):
    ok = sandbox.run("import collections, heapq, bisect, functools, itertools, math, re, typing")
    assert ok.status == "ok"
    assert sandbox.run("import numpy").status == "error:ModuleNotFoundError"


def test_pool_keeps_order_and_runs_in_parallel(sandbox):
    # programs that take a while (sleeping: no CPU), so that four run at once in the pool
    programs = [f"import time\ntime.sleep(0.3)\nprint({i})" for i in range(4)]
    seen = []
    with SandboxPool(sandbox, workers=4) as pool:
        results = pool.run_many(programs, on_result=lambda i, r: seen.append(i))
    assert [r.stdout.strip() for r in results] == ["0", "1", "2", "3"]
    assert sorted(seen) == [0, 1, 2, 3]


def test_limits_validation():
    with pytest.raises(ValueError, match="timeout"):
        Limits(timeout=0)
    with pytest.raises(ValueError, match="memory_mb"):
        Limits(memory_mb=0)
    assert Limits(timeout=2.5).rlimits()["RLIMIT_CPU"] == 3
    with pytest.raises(ValueError, match="workers"):
        SandboxPool(make_sandbox("process"), workers=0)


def test_reuse_validation():
    with pytest.raises(ValueError, match="reuse"):
        make_sandbox("process", reuse="sometimes")
    with pytest.raises(ValueError, match="max_programs"):
        make_sandbox("process", max_programs=0)


def test_rlimits_only_process_backend_never_forks():
    assert not make_sandbox("process", isolation="rlimits").forking
    strict = make_sandbox("process", LIMITS, isolation="rlimits", reuse="fork")
    result = strict.run("print(1)")
    assert result.status == "sandbox_error" and "namespaces" in result.stderr


def test_unknown_backend():
    with pytest.raises(ValueError, match="unknown sandbox backend"):
        make_sandbox("chroot")


def test_available_backends_reports_reasons():
    report = available_backends()
    assert set(report) == {"process", "bwrap", "docker"}
    assert all(isinstance(v, str) for v in report.values())


def test_auto_prefers_bwrap_when_it_works():
    from corrgrpo_sandbox.bwrap import bwrap_available

    assert make_sandbox("auto").name == ("bwrap" if bwrap_available() else "process")


_DOCKER_OK, _DOCKER_REASON = docker_available()


@pytest.mark.skipif(not _DOCKER_OK, reason=f"docker backend: {_DOCKER_REASON}")
def test_docker_backend_runs_and_isolates():
    with make_sandbox("docker", LIMITS) as box:
        assert box.run("print(1)").stdout.strip() == "1"
        assert box.run("assert False").status == "assertion"
        assert box.run("while True: pass").status == "timeout"
        net = box.run("import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=1)")
        assert net.status.startswith("error:")
        assert box.run("print(2)").stdout == "2\n"


def test_docker_missing_image_says_how_to_build_one():
    ok, reason = docker_available("corrgrpo/no-such-image:never")
    assert not ok
    assert "docker_engine.sh" in reason


@pytest.fixture(scope="module")
def venv_under_tmp(tmp_path_factory):
    """An interpreter living under /tmp (a folder every sandbox covers with its own tmpfs)."""
    root = tmp_path_factory.mktemp("venv-under-tmp")
    assert str(root).startswith("/tmp/")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True,
                   timeout=120)
    (root / "lib").mkdir()
    (root / "lib" / "extra_module_under_tmp.py").write_text("VALUE = 42\n")
    return root


@pytest.mark.parametrize("backend", ["process", "bwrap"])
@pytest.mark.parametrize("reuse", ["fork", "fresh"])
def test_interpreter_and_paths_under_tmp_stay_visible(venv_under_tmp, backend, reuse):
    python = str(venv_under_tmp / "venv" / "bin" / "python")
    try:
        box = make_sandbox(backend, LIMITS, python=python, paths=[str(venv_under_tmp / "lib")],
                           reuse=reuse)
    except SandboxUnavailable as exc:
        pytest.skip(f"{backend} backend: {exc}")
    with box:
        result = box.run("import sys, extra_module_under_tmp as m\nprint(sys.executable, m.VALUE)\n"
                         "open('/tmp/work/x', 'w').write('fine')")
    assert result.status == "ok", result.stderr
    assert result.stdout.split() == [python, "42"]


def test_auto_says_loudly_why_it_does_not_use_bwrap():
    with pytest.warns(SandboxDowngrade, match="bwrap unavailable") as caught:
        box = make_sandbox("auto", LIMITS, python="/nonexistent/bin/python3")
    assert box.name == "process"
    assert "python3" in str(caught[0].message) or "bubblewrap" in str(caught[0].message)


def test_docker_unavailable_raises_clearly():
    if _DOCKER_OK:
        pytest.skip("a docker engine is reachable here")
    with pytest.raises(SandboxUnavailable):
        make_sandbox("docker")


def test_code_sandboxes_command_says_what_runs_and_why(capsys):
    import argparse

    from corrgrpo_envs.code.commands import run

    assert run(argparse.Namespace(code_command="sandboxes")) == 0
    out = capsys.readouterr().out.splitlines()
    report = available_backends()
    for name, reason in report.items():
        assert any(line.startswith(name) and (reason in line if reason else line.endswith("ok"))
                   for line in out), (name, out)
    assert any(line.startswith("auto     -> ") for line in out)
    assert any(line.startswith("programs run as ") for line in out)
    assert any(line.startswith("per-sandbox memory and process caps: ") for line in out)
    assert any(line.startswith("CPU time of a program (efficiency): ") for line in out)
    assert any(line.startswith("seccomp filter: ") for line in out)
