"""``corrgrpo redteam [--backend B] [--only NAME ...] [--list]``: every known attack class of
every domain against this machine, ``held``, ``BROKEN`` or ``skipped`` each (exit status 1 when
one that ran is broken).

The classes (:mod:`corrgrpo_envs.redteam`): the code domain's sandbox and host-side judge,
AgentDojo's pasting (:mod:`corrgrpo_envs.agentdojo.paste_probes`), and the OpenEnv boundary,
a served env under attack (``openenv_server_*``) and the client against hostile servers
(``openenv_client_*``, :mod:`corrgrpo_envs.integrations.openenv_probes`). A class whose
optional part is not installed is skipped, with the command that installs it. Every line of
the report fits :data:`WIDTH` columns (a long detail goes on indented lines below its class).
``corrgrpo code redteam`` is this command.
"""

from __future__ import annotations

import argparse
import textwrap

__all__ = ["WIDTH", "add_arguments", "outcome_lines", "run"]

#: Columns every line of the report fits.
WIDTH = 100

#: Where a class's detail goes on when it does not fit its first line.
_INDENT = " " * 8


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", default="auto", help="sandbox backend: auto, process, bwrap or docker")
    parser.add_argument("--only", nargs="+", default=None, metavar="NAME", help="these attack classes")
    parser.add_argument("--list", action="store_true", help="list the attack classes and exit")


def _wrapped(first: str, text: str, indent: str = _INDENT) -> list[str]:
    """``first`` then ``text``, as lines of at most :data:`WIDTH` columns (the later ones
    indented)."""
    return textwrap.wrap(text, WIDTH, initial_indent=first, subsequent_indent=indent,
                         break_on_hyphens=False) or [first.rstrip()]


def outcome_lines(outcome) -> list[str]:
    """The report's lines for one :class:`~corrgrpo_envs.redteam.registry.Outcome`."""
    status = "skipped" if outcome.skipped else "held" if outcome.held else "BROKEN"
    return _wrapped(f"{status:7s} {outcome.name:36s} {outcome.seconds:5.1f} s  ", outcome.detail)


def run(args: argparse.Namespace) -> int:
    """Print ``held``/``BROKEN``/``skipped`` per attack class; 1 when any that ran is broken."""
    from corrgrpo_envs.redteam import register_domains, registry

    absent = register_domains()
    ATTACKS, run_attacks = registry.ATTACKS, registry.run_attacks

    if args.list:
        for attack in ATTACKS:
            print("\n".join(_wrapped(f"{attack.name:36s} ", attack.description, " " * 37)))
        if absent:
            print("\n".join(_wrapped("", absent)))
        return 0

    def show(outcome) -> None:
        print("\n".join(outcome_lines(outcome)), flush=True)

    try:
        outcomes = run_attacks(args.backend, args.only, on_outcome=show)
    except ValueError as exc:
        print("\n".join(_wrapped("error: ", str(exc) + (f" ({absent})" if absent else ""))))
        return 2
    ran = [o for o in outcomes if not o.skipped]
    broken = [o.name for o in ran if not o.held]
    skipped = len(outcomes) - len(ran)
    if absent and args.only is None:
        print("\n".join(_wrapped("skipped ", absent)))
    summary = f"{len(ran) - len(broken)} of {len(ran)} attack classes held" + \
        (f"; broken: {', '.join(broken)}" if broken else "") + \
        (f"; {skipped} skipped (optional parts not installed)" if skipped else "")
    print("\n".join(_wrapped("", summary)))
    return 1 if broken else 0
