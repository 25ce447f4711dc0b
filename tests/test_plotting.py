"""``corrgrpo plot``: one colour per run in every panel, correlation panels only where logged."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.figure


def _run(folder: Path, rows: list[dict]) -> Path:
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_a_run_keeps_its_colour_in_panels_the_others_did_not_log(tmp_path, monkeypatch):
    from corrgrpo.trainer.plotting import plot_runs

    first = _run(tmp_path / "a", [{"step": s, "reward/weighted/mean": s, "reward/x/mean": s} for s in (1, 2)])
    second = _run(tmp_path / "b", [{"step": s, "reward/weighted/mean": -s, "reward/x/mean": -s,
                                    "group_weight/x/median": 2.0} for s in (1, 2)])
    figures = []
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda self, *a, **k: figures.append(self))
    plot_runs([first, second], tmp_path / "out.png", labels=["a", "b"])
    axes = {ax.get_title(): ax for ax in figures[0].axes if ax.get_visible()}
    assert [line.get_color() for line in axes["weighted"].get_lines()] == ["C0", "C1"]
    # only the second run logged this panel: its line keeps the second run's colour
    assert [line.get_color() for line in axes["group_weight/x/median"].get_lines()] == ["C1"]
    # neither run logged a correlation matrix: no correlation panels
    assert not any(title.startswith("correlation") for title in axes)
