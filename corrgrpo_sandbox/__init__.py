"""Sandboxes for untrusted Python programs.

One interface (:class:`Sandbox.run` -> :class:`RunResult`), three backends:

* ``process``: a fresh ``python -I -S`` under ``unshare`` namespaces, a
  read-only allow-list view of the host's files (:mod:`corrgrpo_sandbox.view`:
  no data set, checkout or home folder), private ``/tmp``, no capabilities,
  resource limits and a wall timeout that kills the process group (degrades to
  limits only where namespaces are unavailable);
* ``bwrap``: the same interpreter inside bubblewrap, as an unprivileged user;
* ``docker``: containers without network, through the Docker SDK (needs an engine,
  local or named by ``DOCKER_HOST``).

``process`` and ``bwrap`` reuse interpreters by default (``reuse="auto"``): one
long-lived sandbox per worker with a fork server inside that forks a child per
program and cleans up after it (:mod:`corrgrpo_sandbox.forkserver`);
``reuse="fresh"`` starts a new interpreter per program.

``make_sandbox("auto")`` picks ``bwrap`` when it works here, else ``process``.
:class:`SandboxPool` runs many programs in parallel. The plain types (limits, results, errors)
are in :mod:`corrgrpo_sandbox.types`; the code that runs inside a sandbox (the runner, the fork
server, the docker relay) in :mod:`corrgrpo_sandbox.inside`. The threat model:
``docs/explanation/threat-model.md``. This package imports nothing else of corrgrpo.
"""

from __future__ import annotations

from typing import Any

from corrgrpo_sandbox.base import Sandbox
from corrgrpo_sandbox.pool import SandboxPool, default_workers
from corrgrpo_sandbox.types import Limits, RunResult, SandboxDowngrade, SandboxUnavailable

__all__ = [
    "BACKENDS",
    "Limits",
    "RunResult",
    "Sandbox",
    "SandboxDowngrade",
    "SandboxPool",
    "SandboxUnavailable",
    "available_backends",
    "default_workers",
    "make_sandbox",
]

BACKENDS = ("process", "bwrap", "docker")


def make_sandbox(backend: str = "auto", limits: Limits | None = None, **kwargs: Any) -> Sandbox:
    """A sandbox by name: ``auto``, ``process``, ``bwrap`` or ``docker``.

    ``auto`` is ``bwrap`` when bubblewrap works on this machine, else ``process``
    (with a :class:`~corrgrpo_sandbox.types.SandboxDowngrade` warning that
    says why bubblewrap does not work). Raises :class:`SandboxUnavailable` when the
    named backend cannot run here.
    """
    if backend == "auto":
        from corrgrpo_sandbox.bwrap import bwrap_unavailable_reason
        from corrgrpo_sandbox.process import isolation_warning

        reason = bwrap_unavailable_reason(kwargs.get("python"))
        backend = "process" if reason else "bwrap"
        if reason:
            isolation_warning("bwrap", "the process backend", reason)
    if backend == "process":
        from corrgrpo_sandbox.process import ProcessSandbox

        return ProcessSandbox(limits, **kwargs)
    if backend == "bwrap":
        from corrgrpo_sandbox.bwrap import BwrapSandbox

        return BwrapSandbox(limits, **kwargs)
    if backend == "docker":
        from corrgrpo_sandbox.docker import DockerSandbox

        return DockerSandbox(limits, **kwargs)
    raise ValueError(f"unknown sandbox backend {backend!r}; choose auto or one of {BACKENDS}")


def available_backends() -> dict[str, str]:
    """Each backend -> ``""`` when it works here, else the reason it does not."""
    import warnings

    from corrgrpo_sandbox.bwrap import bwrap_unavailable_reason
    from corrgrpo_sandbox.docker import docker_available
    from corrgrpo_sandbox.process import ProcessSandbox

    process = ProcessSandbox()
    with warnings.catch_warnings():  # the reason is the answer here, not a warning
        warnings.simplefilter("ignore")
        namespaces = process.isolation == "namespaces"
    out = {"process": "" if namespaces else f"limits only: {process.reason}"}
    out["bwrap"] = bwrap_unavailable_reason()
    out["docker"] = docker_available()[1]
    return out
