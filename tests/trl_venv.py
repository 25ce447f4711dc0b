"""Run test code in the TRL venv (``.venv-trl``, built by ``bash scripts/trl_venv.sh``).

TRL pins its own transformers and accelerate, so its tests run in a venv of their own through a
subprocess. A developer's quick loop without that venv skips them with the reason; in CI
(``CI=true``) a missing or incomplete venv fails the test, so the TRL tests cannot skip silently.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.ci import in_ci, unavailable  # noqa: F401 - re-exported for the TRL tests

ROOT = Path(__file__).resolve().parents[1]
TRL_PYTHON = ROOT / ".venv-trl" / "bin" / "python"
#: set in the TRL-venv subprocess so that a test runs its TRL part itself instead of relaunching
IN_TRL_VENV = "CORRGRPO_TEST_IN_TRL_VENV"
BUILD = "bash scripts/trl_venv.sh"


def require_trl_venv() -> Path:
    """The TRL venv's python, or skip (fail in CI) naming the command that builds it."""
    if not TRL_PYTHON.exists():
        unavailable(f".venv-trl is missing ({BUILD} builds it)")
    return TRL_PYTHON


def trl_venv_env() -> dict[str, str]:
    """The environment a process in the TRL venv runs with (checkout on the path, one thread)."""
    return {**os.environ, IN_TRL_VENV: "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
            "PYTHONPATH": str(ROOT)}


def run_in_trl_venv(code: str, *, cwd: Path = ROOT, timeout: float = 600,
                    extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python -c code`` in the TRL venv (checkout on ``sys.path``); fails the test on a non-zero exit."""
    python = require_trl_venv()
    env = {**trl_venv_env(), **(extra_env or {})}
    proc = subprocess.run([str(python), "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    missing = [m for m in ("corrgrpo_envs", "gymnasium", "pytest", "trl") if f"No module named '{m}'" in proc.stderr]
    if proc.returncode != 0 and missing:
        unavailable(f".venv-trl lacks {missing[0]} ({BUILD} installs it)")
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc
