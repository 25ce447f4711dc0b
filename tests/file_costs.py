"""Seconds each test file took in a measured run, so the suite can start with its longest files.

The suite runs a file per worker at a time (``--dist loadfile``). xdist hands files out in
collection order (``--no-loadscope-reorder``; its default order is by number of tests, which puts
a file of one long end-to-end test last). Started last, a one-minute file leaves the other
worker idle for that minute; started first, it overlaps the many short ones. The conftest sorts
the collection by the costs recorded here, longest first (a file not recorded counts as the
median), keeping each file's own order.

Refresh the record from a run's JUnit XML::

    PYTEST_ADDOPTS=--junitxml=/tmp/suite.xml bash scripts/test.sh
    python -m tests.file_costs /tmp/suite.xml
"""

from __future__ import annotations

import json
import statistics
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

RECORD = Path(__file__).with_name("file_costs.json")
ROOT = Path(__file__).resolve().parents[1]


def costs_from_junit(path: Path) -> dict[str, float]:
    """Seconds per test file (``tests/test_x.py``), summed over its test cases, from JUnit XML."""
    per_file: dict[str, float] = defaultdict(float)
    for case in ET.parse(path).getroot().iter("testcase"):
        module = case.get("classname", "").split(".")
        # classname is the dotted module, then a class if the test sits in one
        parts = [p for p in module if p]
        while len(parts) > 1 and not (ROOT / Path(*parts)).with_suffix(".py").exists():
            parts.pop()
        per_file[str(Path(*parts).with_suffix(".py"))] += float(case.get("time", 0) or 0)
    return {name: round(seconds, 1) for name, seconds in sorted(per_file.items())}


def load() -> dict[str, float]:
    """The recorded costs; empty if there is no record (then the collection order stands)."""
    try:
        return json.loads(RECORD.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def longest_first(nodeids: list[str], costs: dict[str, float]) -> list[int]:
    """Indices of ``nodeids`` ordered by their file's cost, longest first; stable within a file."""
    default = statistics.median(costs.values()) if costs else 0.0

    def cost(i: int) -> float:
        return costs.get(nodeids[i].split("::", 1)[0], default)

    return sorted(range(len(nodeids)), key=lambda i: -cost(i))


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(f"usage: python -m tests.file_costs JUNIT_XML  (writes {RECORD.name})", file=sys.stderr)
        return 2
    costs = costs_from_junit(Path(argv[1]))
    RECORD.write_text(json.dumps(costs, indent=1) + "\n")
    print(f"{RECORD}: {len(costs)} files, {sum(costs.values()):.0f} s in all")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
