"""`corrgrpo advise` on the quickstart's run: its three findings, judged on the steps where they hold;
one paragraph per advice in a report of several runs; lines wrapped to the terminal; the run's
estimator named; the recommendations table."""

from __future__ import annotations

import json
import os
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest

from corrgrpo.trainer.advice import ADVICE, advise, examine
from corrgrpo.trainer.advice.report import FALLBACK_WIDTH, render, terminal_width
from corrgrpo.trainer.cli import main
from corrgrpo.trainer.config import Config
from corrgrpo.trainer.estimators import available_estimators

NAMES = ["digits", "has_a", "word_with_a"]
# The quickstart's CorrGRPO run (env_configs/quickstart.yaml, seed 0, 30 steps), as logged: digits'
# share of GRPO's covariance sum (60-100 % in steps 1-13, then negative: the letters vary against
# digits, which has saturated at 32) and has_a's step mean (0.95 -> 0.59). The letter rewards are the
# same signal, and neither varies in any group of steps 6, 12 and 13.
DIGITS_SHARE = [0.602, 0.726, 0.768, 0.839, 0.955, 1.0, 1.008, 0.933, 0.942, 0.664, 0.521, 1.0, 1.0, -1.0,
                -1.0, -1.0, -0.5, -1.0, -0.655, 0.052, 0.453, 0.212, 0.124, -0.138, -0.247, -0.561, -0.551,
                -0.511, -0.325, -0.008]
LETTERS = [0.953, 0.938, 0.938, 0.969, 0.953, 1.0, 0.844, 0.625, 0.141, 0.125, 0.078, 0.0, 0.0, 0.016, 0.031,
           0.047, 0.078, 0.188, 0.312, 0.578, 0.766, 0.734, 0.719, 0.516, 0.469, 0.391, 0.328, 0.359, 0.484,
           0.594]
DIGITS = [0.141, 0.141, 0.328, 0.5, 1.703, 4.891, 10.42, 21.31, 29.28, 30.77, 31.67, 31.89, 31.94, 31.98, 31.97,
          31.95, 31.89, 31.81, 31.61, 31.19, 30.88, 30.94, 30.98, 31.28, 31.36, 31.48, 31.56, 31.52, 31.36, 31.08]
IDLE_LETTERS = {6, 12, 13}


def _quickstart_records(undefined=None, letters=LETTERS, shares=DIGITS_SHARE) -> list[dict]:
    """The run's metrics.jsonl; ``undefined``: what a step where the letters never vary logs for
    their correlation (None now; 0.0 before undefined correlations were None)."""
    records = []
    for step, (share, letter, digits) in enumerate(zip(shares, letters, DIGITS), 1):
        idle = step in IDLE_LETTERS
        rho = undefined if idle else 0.98
        records.append({
            "step": step, "reward_names": NAMES,
            "reward/weighted/mean": digits + 2 * letter, "reward/weighted/std": 1.5,
            "reward/digits/mean": digits, "reward/digits/std": 1.0,
            **{f"reward/{n}/mean": letter for n in NAMES[1:]},
            **{f"reward/{n}/std": float(np.sqrt(letter * (1 - letter))) for n in NAMES[1:]},
            "cov_share/digits": share, **{f"cov_share/{n}": (1 - share) / 2 for n in NAMES[1:]},
            "active_fraction/digits": 1.0, **{f"active_fraction/{n}": 0.0 if idle else 0.5 for n in NAMES[1:]},
            "reward_correlation": [[1.0, 0.1, 0.1], [0.1, None if idle else 1.0, rho],
                                   [0.1, rho, None if idle else 1.0]],
            "k_eff/mean": 2.0, "zero_variance_fraction": 0.0, "c_q/median": 0.6, "update_norm": 0.01,
        })
    return records


def _run(tmp_path: Path, name: str, records: list[dict], estimator: str | None = "corrgrpo") -> Path:
    run = tmp_path / name
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if estimator is not None:
        (run / "config.json").write_text(json.dumps({"algorithm": {"estimator": estimator}}))
    return run


@pytest.mark.parametrize("undefined", [None, 0.0], ids=["logged-missing", "logged-as-0-before"])
def test_the_quickstart_run_gets_its_dominance_duplicates_and_falling_rewards(tmp_path, undefined):
    records = _quickstart_records(undefined)
    # what hid them: the run means (digits' share 14 %; the letters' correlation with the 0s under 0.9)
    assert np.mean(DIGITS_SHARE) == pytest.approx(0.14, abs=0.005)
    logged = [r["reward_correlation"][1][2] for r in records]
    assert undefined is None or np.mean(logged) == pytest.approx(0.882)
    findings = {f.condition: f for f in advise([_run(tmp_path, "quickstart", records)])}
    assert set(findings) == {"dominant", "duplicates", "falling"}
    dominant = findings["dominant"]
    assert dominant.numbers["component"] == "digits"
    assert dominant.numbers["steps"] == [4, 5, 6, 7, 8, 9, 12, 13] and dominant.numbers["fraction"] == 8 / 30
    assert dominant.summary == ("digits holds >= 80% of GRPO's covariance sum in 8 of 30 steps "
                                "(steps 4-9, 12-13; its mean over the run 14%)")
    # the letters' correlation over the 27 steps that define it
    assert findings["duplicates"].numbers == {"components": ["has_a", "word_with_a"],
                                              "correlation": pytest.approx(0.98), "steps": 27}
    falling = findings["falling"].numbers["components"]
    assert list(falling) == ["has_a", "word_with_a"]  # digits rose
    # first and last 6 steps; the range seen: twice the largest per-step std (0.5 at 0.516) is 1.0
    assert falling["has_a"]["first"] == pytest.approx(np.mean(LETTERS[:6]))
    assert falling["has_a"]["last"] == pytest.approx(np.mean(LETTERS[-6:]))
    assert falling["has_a"]["range"] == pytest.approx(1.0, abs=1e-3)
    assert findings["falling"].summary == (
        "has_a fell from 0.958 to 0.437 (by 52% of its range of 1 in the run); word_with_a from 0.958 to 0.437 "
        "(52% of 1): means of the first and last 6 of 30 steps, while the weighted total rose from 3.2 to 32.3")


def test_dominance_in_too_few_steps_and_a_small_or_short_fall_are_not_reported(tmp_path):
    brief = [0.9 if 4 <= step <= 8 else 0.5 for step in range(1, 31)]  # 5 of 30 steps: under 20 %
    assert "dominant" not in {f.condition for f in advise([_run(tmp_path, "brief", _quickstart_records(
        shares=brief))])}
    # a fall of 0.1 on a 0/1 reward whose std reaches 0.5 (10 % of its range), a rise, 9 steps
    small = [0.6 - 0.1 * (step > 15) for step in range(1, 31)]
    rising = LETTERS[::-1]
    for name, letters, steps in (("small", small, 30), ("rising", rising, 30), ("short", LETTERS, 9)):
        records = _quickstart_records(letters=letters)[:steps]
        for r in records:
            r.update({f"reward/{n}/std": 0.5 for n in NAMES[1:]})
        assert "falling" not in {f.condition for f in advise([_run(tmp_path, name, records)])}, name


def test_several_runs_print_each_paragraph_once_wrapped_to_the_terminal(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # short run names: every line can fit
    _run(tmp_path, "corr", _quickstart_records())
    _run(tmp_path, "grpo", _quickstart_records(), estimator="grpo")
    monkeypatch.setenv("COLUMNS", "70")
    assert main(["advise", "corr", "grpo"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    # only a link, which is never broken, runs past the width
    assert [line.split() for line in lines if len(line) > 70] == [
        ["evidence:", ADVICE[key].evidence] for key in ("dominant", "duplicates", "falling")]
    assert max(len(line) for line in lines if "evidence" not in line) > 60
    assert out.count("    try: ") == 3 and out.count("    evidence: ") == 3  # dominant, duplicates, falling
    for condition in ("dominant", "duplicates", "falling"):
        assert out.count(f"[{condition}] corr: ") == 1 and out.count(f"[{condition}] grpo: ") == 1
    flat = " ".join(out.split())
    assert flat.startswith("read: corr (corrgrpo, 30 steps); grpo (grpo, 30 steps) [dominant] corr: digits")
    assert f"try: {' '.join(ADVICE['dominant'].text.split())} evidence:" in flat  # wrapping keeps every word
    # the paragraph follows the last finding that shares it
    grpo = [i for i, line in enumerate(lines) if line.startswith("[dominant] grpo: ")]
    paragraph = [i for i, line in enumerate(lines) if line.startswith("    try: with one reward")]
    assert len(grpo) == len(paragraph) == 1 and grpo[0] + 2 == paragraph[0]  # its summary takes 2 lines


def test_the_width_is_the_terminals_or_100(monkeypatch):
    monkeypatch.setenv("COLUMNS", "123")
    assert terminal_width() == 123
    monkeypatch.delenv("COLUMNS")

    def no_terminal(*_):
        raise OSError("not a terminal")

    monkeypatch.setattr(os, "get_terminal_size", no_terminal)
    assert terminal_width() == FALLBACK_WIDTH == 100


def _far_c_q(tmp_path: Path, name: str, estimator: str | None):
    records = [dict(r, **{"c_q/median": 0.28}) for r in _quickstart_records()]
    (finding,) = [f for f in advise([_run(tmp_path, name, records, estimator)]) if f.condition == "c_q_far"]
    return finding


def test_c_q_is_credited_to_corrgrpo_only_on_a_corrgrpo_run(tmp_path):
    corr = _far_c_q(tmp_path, "corr", "corrgrpo")
    assert corr.summary == "CorrGRPO's median c_q is 0.28 (outside [0.5, 2.0])" and corr.advice_key is None
    grpo = _far_c_q(tmp_path, "grpo", "grpo")
    assert grpo.summary == ("this grpo run's batches have a median c_q of 0.28 (outside [0.5, 2.0]): the factor "
                            "CorrGRPO would have put on GRPO's advantages")
    assert grpo.advice_key == "c_q_far_other" and "CorrGRPO's advantages are" not in grpo.advice
    unknown = _far_c_q(tmp_path, "unknown", None)
    assert "the run's estimator is not in its logs" in unknown.summary


def test_dominance_and_a_falling_reward_under_an_estimator_that_normalises_each_reward(tmp_path, capsys):
    run = _run(tmp_path, "gdpo", _quickstart_records(), estimator="gdpo")
    findings = {f.condition: f for f in advise([run])}
    assert findings["dominant"].advice_key == "dominant_per_reward"
    assert findings["falling"].advice_key == "falling_per_reward"
    assert findings["dominant"].recommendation.estimators == ()  # no switch to what it already is
    assert main(["advise", str(run), "--json"]) == 0
    shown = {f["condition"]: f for f in json.loads(capsys.readouterr().out)}
    assert shown["duplicates"]["recommends"] == {"estimators": ["corrgrpo"], "settings": ["algorithm.reward_weights"]}
    assert shown["dominant"]["advice_key"] == "dominant_per_reward" and shown["dominant"]["recommends"]["estimators"] == []


def test_the_recommendations_name_real_estimators_and_settings():
    known = set(available_estimators())
    config = Config()
    sections = {f.name for f in fields(Config)}
    for key, advice in ADVICE.items():
        assert set(advice.estimators) <= known, key
        for setting in advice.settings:
            section, _, name = setting.partition(".")
            assert section in sections and hasattr(getattr(config, section), name), (key, setting)


def test_render_without_findings_names_the_runs(tmp_path):
    uncorrelated = [[1.0, 0.1, 0.1], [0.1, 1.0, 0.3], [0.1, 0.3, 1.0]]
    quiet = [dict(r, **{"cov_share/digits": 0.4, "reward_correlation": uncorrelated})
             for r in _quickstart_records(letters=[0.5] * 30)]
    report = examine([_run(tmp_path, "quiet", quiet)])
    assert report.findings == []
    assert render(report, width=200).splitlines() == [
        f"read: {tmp_path / 'quiet'} (corrgrpo, 30 steps)", f"no known condition found in {tmp_path / 'quiet'}"]
