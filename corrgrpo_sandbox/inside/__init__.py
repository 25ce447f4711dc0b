"""The code that runs inside a sandbox, kept as real modules and sent in as text.

A sandboxed interpreter runs under ``python -I -S`` (a container's has no copy of this package
at all), so it cannot import these modules: the host reads their source as package resources
and hands the text to the interpreter (``-c``), several modules joined into one program:

* :mod:`.plain`: the plain-data codec of call records (the host imports it too);
* :mod:`.boot`: the runner's bootstrap: isolation, limits, the program, its status;
* :mod:`.server_state` and :mod:`.server`: the fork server and the state it restores;
* :mod:`.relay`: the docker backend's first process in a container;
* :mod:`.carryover_probes`: the programs of :mod:`corrgrpo_sandbox.carryover`.

Every module here uses the standard library only, never ``from __future__`` (the text is
joined), and names what it takes from an earlier module of the same program under
``if TYPE_CHECKING:`` (a local ``False``: those imports never run, linters still see them).
"""

from __future__ import annotations

from importlib import resources

__all__ = ["program_text", "source"]


def source(module: str) -> str:
    """The source text of the module ``module`` of this folder (``"boot"``, ``"relay"``...)."""
    return resources.files(__name__).joinpath(f"{module}.py").read_text(encoding="utf-8")


def program_text(*modules: str, run: str = "") -> str:
    """The modules' sources joined into one program, then ``run`` (the call that starts it)."""
    text = "\n".join(source(m) for m in modules)
    return text + (f"\n{run}\n" if run else "")
