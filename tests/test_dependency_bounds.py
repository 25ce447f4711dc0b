"""The wheel's runtime dependencies: each has an upper bound, and the versions constraints.txt
pins (the ones the tests run with) are inside every range."""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[1]


def _dependencies() -> list[Requirement]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return [Requirement(text) for text in tomllib.load(f)["project"]["dependencies"]]


def _pins() -> dict[str, Version]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        name, sep, version = line.partition("==")
        if sep and not line.startswith("#"):
            pins[name.strip().lower().replace("_", "-")] = Version(version.strip())
    return pins


def test_every_runtime_dependency_has_an_upper_bound():
    unbounded = [str(r) for r in _dependencies() if not any(s.operator in ("<", "<=", "~=", "==") for s in r.specifier)]
    assert not unbounded, unbounded


def test_the_pinned_versions_are_inside_the_ranges():
    pins = _pins()
    for requirement in _dependencies():
        pinned = pins.get(requirement.name.lower())
        if pinned is not None:  # torch is installed before the pins (scripts/setup.sh)
            assert requirement.specifier.contains(pinned), (str(requirement), str(pinned))
    assert {r.name.lower() for r in _dependencies()} - set(pins) == {"torch"}


def test_transformers_stops_before_the_release_that_warns_on_every_run():
    (transformers,) = [r for r in _dependencies() if r.name == "transformers"]
    # 5.24 warns "`past_key_values`/`cache_params` are deprecated" at every generation
    assert not transformers.specifier.contains("5.24.0") and transformers.specifier.contains("5.23.0")
