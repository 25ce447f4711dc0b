"""The code domain's programs that run inside a sandbox, kept as real modules and sent in as text.

* :mod:`.check_env`: the builtins a check runs with (a private ``random`` seeded 0); the host
  imports it for its own verdicts, and the plan program carries its text, so both draw the
  same inputs;
* :mod:`.plan`: the plan program, which runs the reference under the check and records every
  call the check makes.

Standard library only, no ``from __future__`` (the texts are joined after the sandbox's codec,
:data:`corrgrpo_sandbox.calls.PLAIN_SOURCE`); names taken from an earlier part of the same
program are imported under ``if TYPE_CHECKING:`` (a local ``False``), for linters only.
"""

from __future__ import annotations

from importlib import resources

__all__ = ["source"]


def source(module: str) -> str:
    """The source text of the module ``module`` of this folder (``"check_env"``, ``"plan"``)."""
    return resources.files(__name__).joinpath(f"{module}.py").read_text(encoding="utf-8")
