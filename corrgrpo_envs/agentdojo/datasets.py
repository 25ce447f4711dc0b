"""Task sources of the AgentDojo domain: the suites' cases, or a text file of case ids.

Nothing here imports ``agentdojo`` until a source is loaded.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from corrgrpo_envs.agentdojo.cases import (
    DEFAULT_ATTACKS,
    DEFAULT_BENCHMARK_VERSION,
    Case,
    benchmark_suites,
    case_source,
    enumerate_cases,
    known_attacks,
)
from corrgrpo_envs.tasks import DatasetRegistry, TaskSource

__all__ = ["DATASETS"]

DATASETS = DatasetRegistry("agentdojo")


@DATASETS.builtin("agentdojo", "AgentDojo's suites: clean cases and user x injection x attack")
def _builtin_cases(
    benchmark_version: str = DEFAULT_BENCHMARK_VERSION,
    suites: Sequence[str] | None = None,
    attacks: Sequence[str] = DEFAULT_ATTACKS,
    include_clean: bool = True,
) -> TaskSource:
    cases = enumerate_cases(benchmark_version, suites, attacks, include_clean)
    return case_source(cases, benchmark_version)


@DATASETS.file_format(
    "case_list",
    detect=lambda p: p.suffix == ".txt",
    description="a text file of case ids, one per line ('#' starts a comment)",
)
def _case_list(
    path: Path,
    benchmark_version: str = DEFAULT_BENCHMARK_VERSION,
    **_selection: Any,
) -> TaskSource:
    available = benchmark_suites(benchmark_version)
    attacks = set(known_attacks())
    cases = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        try:
            case = Case.from_id(text)
        except ValueError as exc:
            raise ValueError(f"{path}:{lineno}: {exc}") from None
        suite = available.get(case.suite)
        if suite is None or case.user_task_id not in suite.user_tasks:
            raise ValueError(f"{path}:{lineno}: no user task {text!r} in AgentDojo {benchmark_version}")
        if case.attacked and (
            case.injection_task_id not in suite.injection_tasks or case.attack not in attacks
        ):
            raise ValueError(f"{path}:{lineno}: unknown injection task or attack in {text!r}")
        cases.append(case)
    return case_source(cases, benchmark_version, name=path.stem)
