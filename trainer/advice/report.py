"""``corrgrpo advise``'s text: each paragraph of advice once per report, wrapped to the terminal.

Findings that share an advice (the same condition in several runs, several near-duplicate
pairs in one run) are listed together above one ``try:`` paragraph and one ``evidence:`` line,
in the order their first finding came; every line is wrapped to the terminal's width (100
columns where there is no terminal, e.g. in a pipe), continuation lines indented.
"""

from __future__ import annotations

import shutil
import textwrap

from corrgrpo.trainer.advice.findings import Finding, Report, RunInfo
from corrgrpo.trainer.advice.recommendations import where_to_read

__all__ = ["FALLBACK_WIDTH", "render", "terminal_width"]

#: the width without a terminal
FALLBACK_WIDTH = 100


def terminal_width() -> int:
    """The terminal's width in columns (``COLUMNS`` first), :data:`FALLBACK_WIDTH` without one."""
    return shutil.get_terminal_size((FALLBACK_WIDTH, 24)).columns


def _wrap(text: str, width: int, first: str = "", rest: str = "    ") -> str:
    # paths and links stay whole: a line may run past the width rather than break one
    return textwrap.fill(text, width=max(width, 40), initial_indent=first, subsequent_indent=rest,
                         break_long_words=False, break_on_hyphens=False)


def _describe(run: RunInfo) -> str:
    trainer = {"corrgrpo": "", "trl": "TRL, ", "verl": "verl, "}.get(run.kind, f"{run.kind}, ")
    estimator = run.estimator or "estimator not in its logs"
    return f"{run.run} ({trainer}{estimator}, {run.steps} steps)"


def render(report: Report, width: int | None = None) -> str:
    """The report as text: the runs read, then one block per advice (see the module docstring)."""
    width = width or terminal_width()
    lines = [_wrap("read: " + "; ".join(_describe(r) for r in report.runs), width)]
    if not report.findings:
        lines.append(_wrap("no known condition found in " + ", ".join(r.run for r in report.runs), width))
        return "\n".join(lines)
    blocks: dict[str, list[Finding]] = {}
    for f in report.findings:
        blocks.setdefault(f.advice_key or f.condition, []).append(f)
    for group in blocks.values():
        lines += [_wrap(f"[{f.condition}] {f.run}: {f.summary}", width) for f in group]
        lines.append(_wrap(group[0].advice, width, "    try: ", " " * 9))
        lines.append(_wrap(where_to_read(group[0].link), width, "    evidence: ", " " * 14))
    return "\n".join(lines)

