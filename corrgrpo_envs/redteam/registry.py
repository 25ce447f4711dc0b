"""The red team's registry: attack classes by name, and the run of them against this machine.

An attack class is a name, a description and a function that runs it against a
:class:`Target` (a sandbox of the chosen backend, a scratch folder) and returns
``(held, detail)``. Add one with :func:`register`; a probe that needs no sandbox
(``probe_<name>() -> (held, detail)``, e.g. of a host-side judge or an OpenEnv boundary) goes
in with :func:`register_probe`, or all of a module's with :func:`register_probes`.
:func:`run_attacks` runs them (``corrgrpo redteam``); the domains' classes are registered by
:func:`corrgrpo_envs.redteam.register_domains`.
"""

from __future__ import annotations

import importlib
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from corrgrpo_sandbox import Limits, Sandbox, make_sandbox

__all__ = ["ATTACKS", "LIMITS", "AttackClass", "Outcome", "Target", "missing_part", "register",
           "register_probe", "register_probes", "run_attacks"]

#: Limits of the sandbox the attacks run in (small, so that bombs end fast).
LIMITS = Limits(timeout=2.0, memory_mb=256, file_size_mb=4, processes=32, output_bytes=1 << 16)


@dataclass
class Target:
    """What an attack runs against: the backend's sandbox and a scratch folder of the host."""

    backend: str
    sandbox: Sandbox
    folder: Path


@dataclass(frozen=True)
class AttackClass:
    """One kind of attack: ``run(target) -> (held, detail)``; it ``needs`` these modules (an
    optional part of the project, which ``install`` installs)."""

    name: str
    description: str
    run: Callable[[Target], tuple[bool, str]]
    needs: tuple[str, ...] = ()
    install: str = ""


@dataclass(frozen=True)
class Outcome:
    """How one attack class fared: ``held`` (the defence stood) or not, and why; ``skipped``
    (then ``held`` is False and means nothing) when a module it needs is absent."""

    name: str
    held: bool
    detail: str
    seconds: float
    skipped: bool = False


#: Every attack class, in the order they run.
ATTACKS: list[AttackClass] = []


def register(name: str, description: str, needs: tuple[str, ...] = (), install: str = "") \
        -> Callable[[Callable[[Target], tuple[bool, str]]], Callable[[Target], tuple[bool, str]]]:
    """Decorator: add ``fn(target) -> (held, detail)`` to :data:`ATTACKS` as ``name``; a class
    that ``needs`` modules of an optional part is skipped where one cannot be imported, with
    the command that installs them (``install``)."""
    def add(fn: Callable[[Target], tuple[bool, str]]) -> Callable[[Target], tuple[bool, str]]:
        if any(a.name == name for a in ATTACKS):
            raise ValueError(f"attack class {name!r} is registered twice")
        ATTACKS.append(AttackClass(name, description, fn, tuple(needs), install))
        return fn
    return add


def missing_part(attack: AttackClass) -> str:
    """Why ``attack`` cannot run here (a module it needs cannot be imported, and how to install
    it), or ``""``."""
    for module in attack.needs:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            missing = exc.name or module
            why = f"{module} is not installed" if missing == module else \
                f"{module} cannot be imported ({missing} is missing)"
            return why + (f": {attack.install}" if attack.install else "")
    return ""


def register_probe(name: str, description: str, probe: Callable[[], tuple[bool, str]]) -> None:
    """Add a probe that needs no sandbox (``probe() -> (held, detail)``) as an attack class."""
    register(name, description)(lambda target: probe())


def register_probes(module: object, prefix: str = "probe_") -> list[str]:
    """Register every function ``<prefix><name>() -> (held, detail)`` of ``module`` as attack
    class ``<name>`` (its docstring's first line is the description); returns the names."""
    names = []
    for attr in sorted(vars(module)):
        probe = getattr(module, attr)
        if attr.startswith(prefix) and callable(probe):
            name = attr[len(prefix):]
            doc = (getattr(probe, "__doc__", None) or name).strip().splitlines()[0]
            register_probe(name, doc, probe)
            names.append(name)
    return names


def run_attacks(backend: str = "auto", names: Iterable[str] | None = None,
                on_outcome: Callable[[Outcome], None] | None = None) -> list[Outcome]:
    """Run the attack classes (all, or those ``names``) against ``backend``; an attack class
    that raises counts as broken (its defence could not be checked), one whose optional part
    is absent is skipped."""
    chosen = list(ATTACKS)
    if names is not None:
        wanted = list(names)
        unknown = sorted(set(wanted) - {a.name for a in ATTACKS})
        if unknown:
            raise ValueError(f"unknown attack classes {unknown}; known: {[a.name for a in ATTACKS]}")
        chosen = [a for a in ATTACKS if a.name in wanted]
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="corrgrpo-redteam-") as folder:
        sandbox = make_sandbox(backend, LIMITS)
        try:
            target = Target(sandbox.name, sandbox, Path(folder))
            for attack in chosen:
                start = time.perf_counter()
                absent = missing_part(attack)
                if absent:
                    outcome = Outcome(attack.name, False, absent, 0.0, skipped=True)
                    outcomes.append(outcome)
                    if on_outcome is not None:
                        on_outcome(outcome)
                    continue
                try:
                    held, detail = attack.run(target)
                except Exception as exc:  # noqa: BLE001 - the report names it
                    held, detail = False, f"the attack itself failed: {exc!r} " + \
                        traceback.format_exc(limit=2).splitlines()[-1]
                outcome = Outcome(attack.name, bool(held), detail, time.perf_counter() - start)
                outcomes.append(outcome)
                if on_outcome is not None:
                    on_outcome(outcome)
        finally:
            sandbox.close()
    return outcomes
