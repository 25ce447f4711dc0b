"""``corrgrpo redteam [--backend B] [--only NAME ...] [--list]``: every known attack class of
every domain against this machine, ``held`` or ``BROKEN`` each (exit status 1 when one is broken).

The classes (:mod:`corrgrpo_envs.redteam`): the code domain's sandbox and host-side judge,
AgentDojo's pasting (:mod:`corrgrpo_envs.agentdojo.paste_probes`), and the OpenEnv boundary,
a served env under attack (``openenv_server_*``) and the client against hostile servers
(``openenv_client_*``, :mod:`corrgrpo_envs.integrations.openenv_probes`).
``corrgrpo code redteam`` is this command.
"""

from __future__ import annotations

import argparse

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", default="auto", help="sandbox backend: auto, process, bwrap or docker")
    parser.add_argument("--only", nargs="+", default=None, metavar="NAME", help="these attack classes")
    parser.add_argument("--list", action="store_true", help="list the attack classes and exit")


def run(args: argparse.Namespace) -> int:
    """Print ``held``/``broken`` per attack class; 1 when any is broken."""
    from corrgrpo_envs.redteam import register_domains, registry

    absent = register_domains()
    ATTACKS, run_attacks = registry.ATTACKS, registry.run_attacks

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
