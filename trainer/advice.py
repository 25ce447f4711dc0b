"""What a run's diagnostics show, and what this project's measurements say to try.

:func:`advise` reads each run's ``metrics.jsonl`` and checks for the known conditions below,
each with the numbers that support it (means over the run's logged steps) and a line of
advice that links the doc section holding the measurement behind it:

================  ===========================================================================
condition         when (defaults; thresholds are arguments)
================  ===========================================================================
dominant          one component holds >= 80 % of GRPO's covariance sum (``cov_share``)
duplicates        two components' mean within-group correlation >= 0.9
k_eff_one         ``K_eff`` <= 1.3 with more than one component (the rewards move as one)
never_varies      a component varies in <= 1 % of the groups (``active_fraction``; older runs:
                  its diagonal entry of the correlation matrix is 0 at every step); one finding
                  per run names every such component
zero_variance     >= 50 % of the groups have no reward variance at all
c_q_far           CorrGRPO's median multiplier ``c_q`` is outside [0.5, 2]
grad_drift        the gradient norm's median over the last fifth of the steps is >= 2x (or
                  <= 0.5x) that over the first fifth (>= 10 steps with a gradient); the advice
                  follows the direction (``numbers["grad_norm"]["direction"]``: rising, falling)
update_norms      (several runs) the mean ``||delta theta||`` differs by >= 1.5x between runs
no_diagnostics    a TRL or verl run logged none of our diagnostics (only the conditions its own
                  metrics allow were judged)
================  ===========================================================================

A run is one of ours (its folder), a TRL run (its output folder or ``trainer_state.json``) or a
verl run (its file logger's ``.jsonl``): ``trainer.integrations.run_logs`` reads the last two
into the same records, from the ``corrgrpo/`` metrics that ``CorrGRPOTrainer`` and our verl
estimators log.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from trainer.integrations.run_logs import read_run

__all__ = ["Finding", "Thresholds", "advise", "summarise", "where_to_read"]

STUDY = "docs/study.md"
LEARNING = "docs/learning.md"
#: a doc file -> its page in the documentation site's navigation (mkdocs.yml), for an installed
#: package, which carries no docs/ folder
SITE_PAGES = {STUDY: "Results > Estimator studies", LEARNING: "Results > Learning runs",
              "docs/trl.md": "How-to guides > In depth > TRL", "docs/verl.md": "How-to guides > In depth > verl"}
_ROOT = Path(__file__).resolve().parents[1]


def where_to_read(link: str) -> str:
    """``link`` (``docs/page.md#section``) as a reader can follow it here: the file in a
    checkout, else the site's page and the section's anchor (the page's heading, slugged)."""
    page, _, section = link.partition("#")
    if (_ROOT / page).exists():
        return link
    return f"the documentation's page {SITE_PAGES.get(page, page)!r}, section #{section} ({link} in the source)"

#: condition -> (what to try, the doc section with the evidence)
ADVICE: dict[str, tuple[str, str]] = {
    "dominant": (
        "with one reward holding GRPO's covariance sum, GRPO and CorrGRPO (which keeps GRPO's direction "
        "within a group) mostly train that reward; gdpo or mo_grpo give each reward an equal say (toy study: "
        "digits -5.3, letters +0.20, Holm p <= 0.01) at the cost of the dominant one; or rescale its weight",
        f"{STUDY}#toy-one-large-range-reward-two-nearly-identical-01-rewards",
    ),
    "duplicates": (
        "near-duplicate rewards count one signal twice in GRPO's sum; merge them or split one weight between "
        "them; CorrGRPO's denominator counts them about once (on code, syntax and compile: groups where they "
        "vary count 1.3-1.5x less than with one of them)",
        f"{LEARNING}#what-corrgrpos-multiplier-does-with-near-duplicate-rewards",
    ),
    "k_eff_one": (
        "the rewards move as one, so the estimators nearly coincide: on the tool-call rewards (K_eff about 1.1) "
        "no estimator differed significantly from GRPO over 5 seeds; spend the budget elsewhere (warm start, "
        "more steps)",
        f"{LEARNING}#estimators-on-the-tool-call-rewards",
    ),
    "never_varies": (
        "a reward that never varies within a group adds nothing to any estimator's advantage, whatever its "
        "weight; a supervised warm start (corrgrpo sft) taught SmolLM2 the format it never produced in RL",
        f"{LEARNING}#smollm2-135m-instruct-on-tool-calling",
    ),
    "zero_variance": (
        "groups without reward variance give no gradient (the untuned SmolLM2 run: 100 % such groups, every "
        "update skipped); warm-start with corrgrpo sft, raise algorithm.group_size, or set "
        "algorithm.dynamic_sampling=true to resample them",
        f"{STUDY}#a-real-model-briefly-smollm2-135m-instruct-on-tool-calling",
    ),
    "c_q_far": (
        "CorrGRPO's advantages are c_q times GRPO's within each group, so here it mainly changes how much each "
        "group counts; in the toy study c_q 2.5 made it behave like Dr. GRPO and c_q 0.28 (rewards in one "
        "range) cost digits -0.044 (Holm p < 0.01); compare against grpo and dr_grpo before crediting the "
        "correlation term",
        f"{STUDY}#what-it-means",
    ),
    "grad_drift": (
        "AdamW scales a step by the gradient relative to the run's own history (its second moment averages "
        "the past squared gradients), so a gradient that grows makes the later steps larger, whatever its "
        "level; on code, CorrGRPO's c_q rose over the run and its update went from 0.96x GRPO's (steps 1-10) "
        "to 1.28x (steps 31-40) with a gradient 13x smaller; compare update norms between runs before "
        "crediting the estimator, or clip to a norm the gradient reaches",
        f"{LEARNING}#grpo-against-corrgrpo-on-code-from-one-sft-start",
    ),
    # the same condition in the other direction: picked by Finding.advice_key
    "grad_drift_falling": (
        "AdamW scales a step by the gradient relative to the run's own history (its second moment averages "
        "the past squared gradients), so a gradient that falls makes the later steps smaller than the "
        "learning rate suggests, as if the run annealed itself; a falling gradient often means fewer groups "
        "with reward variance (see zero_variance_fraction and the reward curves) rather than convergence; "
        "compare update norms between runs before crediting the estimator",
        f"{LEARNING}#grpo-against-corrgrpo-on-code-from-one-sft-start",
    ),
    "no_diagnostics": (
        "train with trainer.integrations.trl.CorrGRPOTrainer (estimator=None keeps TRL's own advantages) so "
        "that the correlation diagnostics are logged; only the zero-variance groups (TRL's "
        "frac_reward_zero_std) and the gradient norm could be judged",
        "docs/trl.md#our-estimators-in-trl",
    ),
    "no_diagnostics_verl": (
        "register our estimators in verl (trainer.integrations.verl) so that the correlation diagnostics are "
        "logged under corrgrpo/; only the gradient norm could be judged",
        "docs/trl.md#corrgrpo-advise-on-trl-and-verl-runs",
    ),
    "update_norms": (
        "the runs moved their parameters by different amounts per step; under AdamW a uniform scale of the "
        "advantages cancels, so the difference comes from clipping, the learning rate, or how groups and steps "
        "are weighted; compare runs at matched update norms before crediting the estimator",
        f"{STUDY}#what-it-means",
    ),
}


@dataclass(frozen=True)
class Thresholds:
    """When each condition is reported (see the module docstring)."""

    dominant_share: float = 0.8
    duplicate_correlation: float = 0.9
    k_eff_near_one: float = 1.3
    never_varies: float = 0.01
    zero_variance: float = 0.5
    c_q_low: float = 0.5
    c_q_high: float = 2.0
    update_norm_ratio: float = 1.5
    grad_drift: float = 2.0
    grad_drift_min_steps: int = 10


@dataclass
class Finding:
    """One condition a run (or a set of runs) shows."""

    condition: str
    run: str
    summary: str
    numbers: dict[str, Any] = field(default_factory=dict)
    advice_key: str | None = None
    """The :data:`ADVICE` entry when it is not ``condition``'s own (a condition whose number can
    go either way, e.g. ``grad_drift_falling``)."""

    @property
    def advice(self) -> str:
        return ADVICE[self.advice_key or self.condition][0]

    @property
    def link(self) -> str:
        return ADVICE[self.advice_key or self.condition][1]

    def to_dict(self) -> dict[str, Any]:
        return {"condition": self.condition, "run": self.run, "summary": self.summary,
                "numbers": self.numbers, "advice": self.advice, "link": self.link}


def _mean(records: Sequence[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in records if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
    return float(np.mean(values)) if values else None


def _names(records: Sequence[dict[str, Any]]) -> list[str]:
    for r in reversed(records):
        if r.get("reward_names"):
            return list(r["reward_names"])
    return sorted({k[7:-5] for r in records for k in r if k.startswith("reward/") and k.endswith("/mean")} - {"weighted"})


def _drift(values: Sequence[Any]) -> dict[str, float] | None:
    """Median of the last fifth of the finite positive ``values`` over that of the first fifth
    (at least 2 values each), with the count; None for fewer than 4 values."""
    kept = [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v) and v > 0]
    if len(kept) < 4:
        return None
    window = max(2, len(kept) // 5)
    first, last = float(np.median(kept[:window])), float(np.median(kept[-window:]))
    return {"first": first, "last": last, "ratio": last / first, "steps": len(kept), "window": window}


def summarise(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The run-level numbers the conditions are judged on (means over the logged steps)."""
    names = _names(records)
    out: dict[str, Any] = {"steps": len(records), "names": names}
    out["cov_share"] = {n: _mean(records, f"cov_share/{n}") for n in names}
    out["active_fraction"] = {n: _mean(records, f"active_fraction/{n}") for n in names}
    for key in ("k_eff/mean", "zero_variance_fraction", "c_q/median", "update_norm", "grad_norm"):
        out[key] = _mean(records, key)
    out["grad_norm_drift"] = _drift([r.get("grad_norm") for r in records])
    out["c_q_drift"] = _drift([r.get("c_q/median") for r in records])
    mats = [np.array([[np.nan if v is None else v for v in row] for row in r["reward_correlation"]], float)
            for r in records if r.get("reward_correlation")]
    if mats:
        stack = np.stack(mats)
        with np.errstate(invalid="ignore"):
            finite = np.isfinite(stack)
            counts = finite.sum(axis=0)
            out["correlation"] = np.where(counts > 0, np.nansum(stack, axis=0) / np.maximum(counts, 1), np.nan)
        out["diagonal_zero_always"] = [bool(np.all(np.nan_to_num(stack[:, k, k]) == 0)) for k in range(stack.shape[1])]
    return out


def _run_findings(run: str, s: dict[str, Any], t: Thresholds) -> list[Finding]:
    found: list[Finding] = []
    names, steps = s["names"], s["steps"]
    shares = {n: v for n, v in s["cov_share"].items() if v is not None}
    if shares:
        top = max(shares, key=lambda n: shares[n])
        if shares[top] >= t.dominant_share:
            found.append(Finding("dominant", run, f"{top} holds {shares[top]:.0%} of GRPO's covariance sum "
                                 f"(mean over {steps} steps)", {"component": top, "cov_share": shares}))
    corr = s.get("correlation")
    if corr is not None:
        for a in range(len(corr)):
            for b in range(a + 1, len(corr)):
                value = corr[a, b]
                if np.isfinite(value) and value >= t.duplicate_correlation and a < len(names) and b < len(names):
                    found.append(Finding("duplicates", run, f"{names[a]} and {names[b]} have a mean within-group "
                                         f"correlation of {value:.2f} (threshold {t.duplicate_correlation})",
                                         {"components": [names[a], names[b]], "correlation": float(value)}))
    k_eff = s.get("k_eff/mean")
    if k_eff is not None and len(names) > 1 and k_eff <= t.k_eff_near_one:
        found.append(Finding("k_eff_one", run, f"K_eff is {k_eff:.2f} for {len(names)} rewards (mean over "
                             f"{steps} steps)", {"k_eff": k_eff, "components": len(names)}))
    idle: dict[str, float | None] = {}  # one finding for them all: the advice is the same
    for k, n in enumerate(names):
        active = s["active_fraction"].get(n)
        never = active <= t.never_varies if active is not None else (
            k < len(s.get("diagonal_zero_always", [])) and s["diagonal_zero_always"][k])
        if never:
            idle[n] = active
    if idle:
        parts = [f"{n} {'never' if not a else f'in {a:.1%} of the groups'}" for n, a in idle.items()]
        verb = "varies" if len(idle) == 1 else "vary"
        found.append(Finding("never_varies", run, f"{'; '.join(parts)}: {verb} within a group "
                             f"(over {steps} steps)", {"components": list(idle), "active_fraction": idle}))
    zero = s.get("zero_variance_fraction")
    if zero is not None and zero >= t.zero_variance:
        found.append(Finding("zero_variance", run, f"{zero:.0%} of the groups have no reward variance (mean "
                             f"over {steps} steps)", {"zero_variance_fraction": zero}))
    c_q = s.get("c_q/median")
    if c_q is not None and not t.c_q_low <= c_q <= t.c_q_high:
        found.append(Finding("c_q_far", run, f"CorrGRPO's median c_q is {c_q:.2f} (outside "
                             f"[{t.c_q_low}, {t.c_q_high}])", {"c_q_median": c_q}))
    drift = s.get("grad_norm_drift")
    if drift is not None and drift["steps"] >= t.grad_drift_min_steps and not (
            1 / t.grad_drift < drift["ratio"] < t.grad_drift):
        c_q_drift = s.get("c_q_drift")
        also = f"; CorrGRPO's median c_q {c_q_drift['first']:.3g} -> {c_q_drift['last']:.3g}" if c_q_drift else ""
        rising = drift["ratio"] > 1
        found.append(Finding(
            "grad_drift", run,
            f"the gradient norm {'rose' if rising else 'fell'} from {drift['first']:.3g} to {drift['last']:.3g} "
            f"({drift['ratio']:.2f}x; medians of the first and last {drift['window']} of {drift['steps']} steps "
            f"with a gradient){also}",
            {"grad_norm": {**drift, "direction": "rising" if rising else "falling"}, "c_q_median": c_q_drift},
            advice_key=None if rising else "grad_drift_falling",
        ))
    return found


def advise(run_dirs: Sequence[str | Path], thresholds: Thresholds | None = None) -> list[Finding]:
    """The findings of each run, then those comparing the runs (update norms)."""
    t = thresholds or Thresholds()
    findings: list[Finding] = []
    norms: dict[str, float] = {}
    for run_dir in run_dirs:
        log = read_run(run_dir)
        summary = summarise(log.records)
        findings += _run_findings(str(run_dir), summary, t)
        if not log.has_diagnostics:
            findings.append(Finding(
                "no_diagnostics", str(run_dir),
                f"this {'TRL' if log.kind == 'trl' else 'verl'} run logged none of corrgrpo's diagnostics "
                f"({len(log.records)} steps read from {log.path})",
                {"kind": log.kind, "steps": len(log.records), "log": str(log.path)},
                advice_key="no_diagnostics_verl" if log.kind == "verl" else None,
            ))
        if summary.get("update_norm") is not None:
            norms[str(run_dir)] = summary["update_norm"]
    if len(norms) > 1:
        low, high = min(norms, key=norms.get), max(norms, key=norms.get)
        if norms[low] > 0 and norms[high] / norms[low] >= t.update_norm_ratio:
            findings.append(Finding(
                "update_norms", "all",
                f"mean ||delta theta|| per step differs {norms[high] / norms[low]:.1f}x between runs: "
                f"{norms[high]:.3g} ({high}) vs {norms[low]:.3g} ({low})", {"update_norm": norms},
            ))
    return findings
