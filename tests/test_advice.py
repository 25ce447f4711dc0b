"""`corrgrpo advise`: each known condition on and off in synthetic metrics files, and on short runs
of the study's toy settings it says what the study measured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from corrgrpo.agents.models import default_anchor_tokenizer
from corrgrpo.trainer.advice import ADVICE, advise
from corrgrpo.trainer.cli import main

ROOT = Path(__file__).resolve().parents[1]
NAMES = ["big", "a", "b"]


def _record(step: int, **changes) -> dict:
    record = {
        "step": step, "reward_names": NAMES,
        "reward/weighted/mean": 1.0, **{f"reward/{n}/mean": 0.5 for n in NAMES},
        "cov_share/big": 0.4, "cov_share/a": 0.3, "cov_share/b": 0.3,
        "reward_correlation": [[1.0, 0.2, 0.1], [0.2, 1.0, 0.3], [0.1, 0.3, 1.0]],
        "k_eff/mean": 2.5, **{f"active_fraction/{n}": 1.0 for n in NAMES},
        "zero_variance_fraction": 0.0, "c_q/median": 1.1, "update_norm": 0.01,
    }
    record.update(changes)
    return record


def _run(tmp_path: Path, name: str, steps: int = 4, **changes) -> Path:
    run = tmp_path / name
    run.mkdir()
    with open(run / "metrics.jsonl", "w") as f:
        for step in range(1, steps + 1):
            f.write(json.dumps(_record(step, **changes)) + "\n")
    return run


def _conditions(runs) -> set[str]:
    return {f.condition for f in advise(runs)}


CASES = {
    "dominant": {"cov_share/big": 0.95, "cov_share/a": 0.03, "cov_share/b": 0.02},
    "duplicates": {"reward_correlation": [[1.0, 0.2, 0.1], [0.2, 1.0, 0.97], [0.1, 0.97, 1.0]]},
    "k_eff_one": {"k_eff/mean": 1.1},
    "never_varies": {"active_fraction/b": 0.0},
    "zero_variance": {"zero_variance_fraction": 0.8},
    "c_q_far": {"c_q/median": 0.28},
}


def test_a_healthy_run_shows_no_condition(tmp_path, capsys):
    run = _run(tmp_path, "healthy")
    assert advise([run]) == []
    assert main(["advise", str(run)]) == 0
    assert "no known condition" in capsys.readouterr().out


@pytest.mark.parametrize("condition", sorted(CASES))
def test_each_condition_on_and_off(tmp_path, condition):
    on = _run(tmp_path, "on", **CASES[condition])
    assert _conditions([on]) == {condition}
    # just inside the threshold: off
    near = {
        "dominant": {"cov_share/big": 0.79, "cov_share/a": 0.11, "cov_share/b": 0.10},
        "duplicates": {"reward_correlation": [[1.0, 0.2, 0.1], [0.2, 1.0, 0.89], [0.1, 0.89, 1.0]]},
        "k_eff_one": {"k_eff/mean": 1.31},
        "never_varies": {"active_fraction/b": 0.02},
        "zero_variance": {"zero_variance_fraction": 0.49},
        "c_q_far": {"c_q/median": 0.51},
    }[condition]
    assert _conditions([_run(tmp_path, "off", **near)]) == set()


def test_the_findings_carry_their_numbers_and_links(tmp_path, capsys):
    run = _run(tmp_path, "dup", **CASES["duplicates"], **CASES["dominant"])
    findings = {f.condition: f for f in advise([run])}
    assert findings["duplicates"].numbers == {"components": ["a", "b"], "correlation": pytest.approx(0.97),
                                              "steps": 4}
    assert findings["dominant"].numbers["component"] == "big"
    assert findings["dominant"].summary == ("big holds >= 80% of GRPO's covariance sum in 4 of 4 steps "
                                            "(steps 1-4; its mean over the run 95%)")
    assert main(["advise", str(run)]) == 0
    out = " ".join(capsys.readouterr().out.split())  # the text is wrapped to the terminal
    assert "a and b have a mean within-group correlation of 0.97 over the 4 of 4 steps" in out
    assert "evidence: docs/learning.md#what-corrgrpos-multiplier-does-with-near-duplicate-rewards" in out
    assert main(["advise", str(run), "--json"]) == 0
    assert {f["condition"] for f in json.loads(capsys.readouterr().out)} == {"dominant", "duplicates"}


def test_an_older_run_without_active_fraction_uses_the_correlation_diagonal(tmp_path):
    zero_diag = [[1.0, 0.2, 0.0], [0.2, 1.0, 0.0], [0.0, 0.0, 0.0]]
    run = _run(tmp_path, "old", reward_correlation=zero_diag, **{"active_fraction/b": None})
    assert _conditions([run]) == {"never_varies"}


def test_update_norms_differing_between_runs(tmp_path):
    small, same = _run(tmp_path, "small"), _run(tmp_path, "same", update_norm=0.013)
    large = _run(tmp_path, "large", update_norm=0.05)
    assert _conditions([small, same]) == set()
    (finding,) = advise([small, same, large])
    assert finding.condition == "update_norms" and finding.run == "all"
    assert "differs 5.0x between runs" in finding.summary


def test_every_link_points_at_a_heading_that_exists():
    def anchor(heading: str) -> str:
        text = heading.strip("# ").lower().replace("`", "")
        return "".join(c for c in text if c.isalnum() or c in " -_").replace(" ", "-")

    for advice in ADVICE.values():
        doc, section = advice.evidence.split("#")
        headings = [line for line in (ROOT / doc).read_text().splitlines() if line.startswith("#")]
        assert section in {anchor(h) for h in headings}, advice.evidence


@pytest.fixture(scope="module")
def study_runs(tmp_path_factory):
    """Short runs of the study's toy settings (GRPO, 4 steps each)."""
    if not default_anchor_tokenizer().exists():
        pytest.skip(f"the study's anchor tokenizer is absent ({default_anchor_tokenizer()})")
    tmp = tmp_path_factory.mktemp("study")
    runs = {}
    for setting in ("study_toy", "study_toy_unit"):
        runs[setting] = tmp / setting
        assert main(["train", f"studies/configs/{setting}.yaml", "train.steps=4", "rollout.torch_threads=1",
                     f"train.output_dir={runs[setting]}"]) == 0
    return runs


def test_advice_on_the_study_settings_agrees_with_the_study(study_runs):
    toy = {f.condition: f for f in advise([study_runs["study_toy"]])}
    unit = {f.condition: f for f in advise([study_runs["study_toy_unit"]])}
    # toy: digits holds 0.98 of the covariance sum, has_a ~ word_with_a 0.99, c_q about 2.5
    assert toy["dominant"].numbers["component"] == "digits"
    assert toy["duplicates"].numbers["components"] == ["has_a", "word_with_a"]
    assert toy["c_q_far"].numbers["c_q_median"] > 2.0
    # toy_unit: no dominant reward (digits 0.41), the same duplicates, c_q about 0.28
    assert "dominant" not in unit
    assert unit["duplicates"].numbers["components"] == ["has_a", "word_with_a"]
    assert unit["c_q_far"].numbers["c_q_median"] < 0.5
    # neither: K_eff 2.0 / 1.65, no zero-variance groups, every reward varies
    for found in (toy, unit):
        assert not {"k_eff_one", "zero_variance", "never_varies"} & set(found)


def _drifting_run(tmp_path: Path, name: str, grads: list[float]) -> Path:
    run = tmp_path / name
    run.mkdir()
    with open(run / "metrics.jsonl", "w") as f:
        for step, g in enumerate(grads, 1):
            f.write(json.dumps(_record(step, grad_norm=g, **{"c_q/median": 1.0 + g})) + "\n")
    return run


def test_a_drifting_gradient_norm(tmp_path):
    # 12 steps: windows of the first and last 2 steps with a gradient (a skipped step, 0, is left out)
    rising = [0.1, 0.1, 0.0, 0.15, 0.12, 0.13, 0.14, 0.16, 0.18, 0.2, 0.25, 0.25]
    (finding,) = advise([_drifting_run(tmp_path, "rising", rising)])
    assert finding.condition == "grad_drift"
    assert finding.numbers["grad_norm"] == pytest.approx(
        {"first": 0.1, "last": 0.25, "ratio": 2.5, "steps": 11, "window": 2, "direction": "rising"})
    assert "rose from 0.1 to 0.25 (2.50x; medians of the first and last 2 of 11 steps" in finding.summary
    assert "median c_q 1.1 -> 1.25" in finding.summary
    assert _conditions([_drifting_run(tmp_path, "falling", rising[::-1])]) == {"grad_drift"}
    # just inside the threshold, or too few steps: off
    assert _conditions([_drifting_run(tmp_path, "near", [0.1] * 6 + [0.19] * 6)]) == set()
    assert _conditions([_drifting_run(tmp_path, "short", [0.1] * 4 + [0.5] * 5)]) == set()


def test_an_installed_package_names_the_sites_page_instead_of_a_missing_file(monkeypatch, tmp_path):
    from corrgrpo.trainer.advice import recommendations

    link = recommendations.ADVICE["dominant"].evidence
    assert recommendations.where_to_read(link) == link  # a checkout: the file is there
    monkeypatch.setattr(recommendations, "_ROOT", tmp_path)  # an installed package: no docs/ beside it
    shown = recommendations.where_to_read(link)
    assert shown.startswith("the documentation's page 'Results > Estimator studies', section #toy-one-")
    assert shown.endswith(f"({link} in the source)")
