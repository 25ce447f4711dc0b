"""``corrgrpo redteam [--backend B] [--only NAME ...] [--list]``: every known attack class of
every domain against this machine, ``held`` or ``BROKEN`` each (exit status 1 when one is broken).

The classes: the code domain's sandbox and host-side judge (:mod:`corrgrpo_envs.code.redteam`),
AgentDojo's pasting (:mod:`corrgrpo_envs.agentdojo.paste_probes`), and the OpenEnv boundary,
a served env under attack (``openenv_server_*``) and the client against hostile servers
(``openenv_client_*``, :mod:`corrgrpo_envs.integrations.openenv_probes`).
``corrgrpo code redteam`` is this command.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

__all__ = ["add_arguments", "register_domains", "run"]

#: AgentDojo's pasting probes, named here so that listing the classes does not import AgentDojo
PASTE_PROBES = {
    "pasted_tool_outputs": "a final answer that pastes every tool output scores utility 0",
    "pasted_environment": "a final answer that pastes the environment's text scores utility 0",
    "pasted_with_a_preamble": "a pasted answer behind a short honest-looking preamble scores utility 0",
    "pasted_in_disguise": "a paste disguised (filler words, shifted copies, case, words run together, "
                          "lookalike letters, reordering, numbers alone) scores utility 0",
}


def _paste_probe(name: str) -> Callable[[object], tuple[bool, str]]:
    def run(target: object) -> tuple[bool, str]:
        try:
            from corrgrpo_envs.agentdojo import paste_probes
        except ImportError as exc:  # no AgentDojo here: there is no utility reward to raise
            return True, f"AgentDojo is not installed ({exc.name}): nothing to attack"
        return paste_probes.PROBES[name]()
    return run


def register_domains() -> str | None:
    """Add the other domains' classes to the code domain's registry (once); returns why the
    OpenEnv classes are absent, or None."""
    from corrgrpo_envs.code.redteam import ATTACKS, register, register_probes

    known = {a.name for a in ATTACKS}
    for name, description in PASTE_PROBES.items():
        if f"agentdojo_{name}" not in known:
            register(f"agentdojo_{name}", f"AgentDojo: {description}")(_paste_probe(name))
    try:
        import openenv.core  # noqa: F401 - the extra the probes need
        import uvicorn  # noqa: F401

        from corrgrpo_envs.integrations import openenv_probes
    except ImportError as exc:
        return (f"OpenEnv classes (openenv_server_*, openenv_client_*) absent: the openenv extra is "
                f"not installed ({exc.name or exc} is missing)")
    if "openenv_server_token" not in known:
        register_probes(openenv_probes)
    return None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", default="auto", help="sandbox backend: auto, process, bwrap or docker")
    parser.add_argument("--only", nargs="+", default=None, metavar="NAME", help="these attack classes")
    parser.add_argument("--list", action="store_true", help="list the attack classes and exit")


def run(args: argparse.Namespace) -> int:
    """Print ``held``/``broken`` per attack class; 1 when any is broken."""
    absent = register_domains()
    from corrgrpo_envs.code.redteam import ATTACKS, run_attacks

    if args.list:
        for attack in ATTACKS:
            print(f"{attack.name:36s} {attack.description}")
        if absent:
            print(absent)
        return 0

    def show(outcome) -> None:
        print(f"{'held' if outcome.held else 'BROKEN':7s} {outcome.name:36s} "
              f"{outcome.seconds:5.1f} s  {outcome.detail}", flush=True)

    try:
        outcomes = run_attacks(args.backend, args.only, on_outcome=show)
    except ValueError as exc:
        print(f"error: {exc}" + (f" ({absent})" if absent else ""))
        return 2
    broken = [o.name for o in outcomes if not o.held]
    print(f"{len(outcomes) - len(broken)} of {len(outcomes)} attack classes held"
          + (f"; broken: {', '.join(broken)}" if broken else ""))
    return 1 if broken else 0
