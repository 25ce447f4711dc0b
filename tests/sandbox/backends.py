"""The sandbox backends x reuse modes the kernel-level tests run on, as one pytest fixture maker.

Docker's cases skip with the engine's reason when no engine answers; a backend that cannot
start here skips with its own reason.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from corrgrpo_sandbox import Limits, Sandbox, SandboxUnavailable, make_sandbox
from corrgrpo_sandbox.docker import docker_available

__all__ = ["backend_params", "open_sandbox"]


def backend_params() -> list:
    """``(backend, reuse)`` for process, bwrap and docker, each in fork and fresh mode."""
    params = []
    docker = docker_available()[1]
    for backend in ("process", "bwrap", "docker"):
        for reuse in ("fork", "fresh"):
            marks = pytest.mark.skipif(bool(docker), reason=docker) if backend == "docker" else ()
            params.append(pytest.param((backend, reuse), id=f"{backend}-{reuse}", marks=marks))
    return params


def open_sandbox(param: tuple[str, str], limits: Limits, *, need_fork: bool = False) -> Iterator[Sandbox]:
    """Yield the sandbox of ``param`` (a fixture body), skipping where it cannot start."""
    backend, reuse = param
    try:
        box = make_sandbox(backend, limits, reuse=reuse)
    except SandboxUnavailable as exc:
        pytest.skip(f"{backend}: {exc}")
    if need_fork and reuse == "fork" and not box.forking:
        box.close()
        pytest.skip(f"{backend}: fork servers need namespaces, unavailable here")
    try:
        yield box
    finally:
        box.close()
