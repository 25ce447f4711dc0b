"""The OpenEnv boundary's attack classes: a served env under attack, a client against hostile
servers (:mod:`corrgrpo_envs.integrations.openenv_probes`), when the openenv extra is here."""

from __future__ import annotations

from corrgrpo_envs.redteam import registry

__all__ = ["INSTALL", "register_openenv_probes"]

#: What installs the OpenEnv classes' part (openenv's own pins clash with the project's).
INSTALL = "pip install 'corrgrpo[openenv]' && pip install --no-deps openenv==0.10.0"


def register_openenv_probes() -> str | None:
    """Add the classes ``openenv_server_*`` and ``openenv_client_*`` (once); returns why they
    are absent, or None."""
    try:
        import openenv.core  # noqa: F401 - the extra the probes need
        import uvicorn  # noqa: F401

        from corrgrpo_envs.integrations import openenv_probes
    except ImportError as exc:
        return (f"OpenEnv classes (openenv_server_*, openenv_client_*) absent: the openenv extra is "
                f"not installed ({exc.name or exc} is missing): {INSTALL}")
    if "openenv_server_token" not in {a.name for a in registry.ATTACKS}:
        registry.register_probes(openenv_probes)
    return None
