"""The red team: every domain's known attacks, runnable against this machine.

``corrgrpo redteam [--backend B]`` (:mod:`.command`) runs every attack class
against a sandbox of this host and prints, per class, ``held`` or ``broken`` with a detail, so
a user can check a host (a GPU container, a cluster node) before training on it. This package
is not a domain: it sees every domain (no domain imports it or another domain). The registry
is :mod:`.registry`; the classes are the code domain's (:mod:`.code_domain`, and the channels
between concurrent programs of :mod:`.channels`), AgentDojo's
(:mod:`.agentdojo_domain`) and the OpenEnv boundary's (:mod:`.openenv_boundary`).
"""

from __future__ import annotations

from corrgrpo_envs.redteam.registry import (
    ATTACKS,
    LIMITS,
    AttackClass,
    Outcome,
    Target,
    register,
    register_probe,
    register_probes,
    run_attacks,
)

__all__ = ["ATTACKS", "LIMITS", "AttackClass", "Outcome", "Target", "register", "register_domains",
           "register_probe", "register_probes", "run_attacks"]


def register_domains() -> str | None:
    """Register every domain's attack classes (once each); returns why the OpenEnv classes are
    absent, or None."""
    from corrgrpo_envs.redteam import channels, code_domain  # noqa: F401 - register on import
    from corrgrpo_envs.redteam.agentdojo_domain import register_paste_probes
    from corrgrpo_envs.redteam.openenv_boundary import register_openenv_probes

    register_paste_probes()
    return register_openenv_probes()
