"""What a run's logged metrics show: the conditions ``corrgrpo advise`` reports.

:func:`examine` reads each run's log and checks for the conditions below, each with the numbers
that support it. A condition that holds in some steps and not others (a reward that dominates
early, then saturates) is judged on the steps where it holds, not on a mean that averages it
away; a value no group defined (a correlation with a reward that never varied) is missing,
not 0.

================  ===========================================================================
condition         when (defaults; thresholds are :class:`Thresholds`)
================  ===========================================================================
dominant          one component holds >= 80 % of GRPO's covariance sum (``cov_share``) in
                  >= 20 % of the steps
duplicates        two components' within-group correlation, averaged over the steps that
                  define it, is >= 0.9
falling           a reward's mean over the last fifth of the steps is below that over the
                  first fifth by >= 20 % of its range in the run (>= 10 steps); one finding
                  per run names every such reward
k_eff_one         ``K_eff`` <= 1.3 with more than one component (the rewards move as one)
never_varies      a component varies in <= 1 % of the groups (``active_fraction``; older runs:
                  its diagonal entry of the correlation matrix is 0 at every step); one finding
                  per run names every such component
zero_variance     >= 50 % of the groups have no reward variance at all
c_q_far           the median of ``c_q`` (CorrGRPO's factor over GRPO's advantages) is
                  outside [0.5, 2]; the finding names the run's estimator
grad_drift        the gradient norm's median over the last fifth of the steps is >= 2x (or
                  <= 0.5x) that over the first fifth (>= 10 steps with a gradient); the advice
                  follows the direction (``numbers["grad_norm"]["direction"]``: rising, falling)
update_norms      (several runs) the mean ``||delta theta||`` differs by >= 1.5x between runs
no_diagnostics    a TRL or verl run logged none of our diagnostics (only the conditions its own
                  metrics allow were judged)
================  ===========================================================================

What each finding recommends is :data:`corrgrpo.trainer.advice.recommendations.ADVICE`, picked by
:attr:`Finding.advice_key`. A run is one of ours (its folder), a TRL run (its output folder,
``trainer_state.json`` or TensorBoard event files) or a verl run (its file logger's ``.jsonl``):
:mod:`corrgrpo.trainer.integrations.run_logs` reads them into the same records.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from corrgrpo.trainer.advice.recommendations import ADVICE, Advice
from corrgrpo.trainer.integrations.run_logs import read_run

__all__ = ["PER_REWARD_ESTIMATORS", "Finding", "Report", "RunInfo", "Thresholds", "advise", "examine", "summarise"]

#: estimators that normalise each reward within its group before summing: a reward's range does
#: not buy it a larger say in their update (GRPO's covariance share then says what GRPO would do)
PER_REWARD_ESTIMATORS = frozenset({"gdpo", "mo_grpo", "gdpo_corr"})


@dataclass(frozen=True)
class Thresholds:
    """When each condition is reported (see the module docstring)."""

    dominant_share: float = 0.8
    dominant_steps: float = 0.2
    """The share of the steps (those that logged a covariance share) in which one component must
    hold ``dominant_share``."""
    dominant_scale_ratio: float = 3.0
    """A dominant reward whose mean per-step std is under this many times the median of the
    others' is not dominant by its range (the rewards may trade off instead): per-reward
    normalisation is not recommended then (the arena's tradeoff regime: gdpo -0.4 [±0.2] points)."""
    duplicate_correlation: float = 0.9
    falling: float = 0.2
    """A fall, last fifth of the steps against the first, as a share of the reward's range in
    the run: the larger of twice its largest per-step std (a reward in [low, high] has a std of
    at most (high - low) / 2) and the spread of its step means."""
    falling_min_steps: int = 10
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
    """The :data:`ADVICE` entry when it is not ``condition``'s own (a condition whose advice
    depends on its direction or on the run's estimator, e.g. ``grad_drift_falling``)."""

    @property
    def recommendation(self) -> Advice:
        return ADVICE[self.advice_key or self.condition]

    @property
    def advice(self) -> str:
        return self.recommendation.text

    @property
    def link(self) -> str:
        return self.recommendation.evidence

    def to_dict(self) -> dict[str, Any]:
        rec = self.recommendation
        return {"condition": self.condition, "run": self.run, "summary": self.summary,
                "numbers": self.numbers, "advice_key": self.advice_key or self.condition,
                "advice": rec.text, "link": rec.evidence,
                "recommends": {"estimators": list(rec.estimators), "settings": list(rec.settings)}}


@dataclass(frozen=True)
class RunInfo:
    """A run as read: where from, which trainer wrote it, its estimator (None: not in its logs)."""

    run: str
    kind: str
    estimator: str | None
    steps: int
    log: str


@dataclass
class Report:
    """The runs read and their findings (each run's, then those comparing runs)."""

    runs: list[RunInfo]
    findings: list[Finding]


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _mean(records: Sequence[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in records if _finite(r.get(key))]
    return float(np.mean(values)) if values else None


def _names(records: Sequence[dict[str, Any]]) -> list[str]:
    for r in reversed(records):
        if r.get("reward_names"):
            return list(r["reward_names"])
    return sorted({k[7:-5] for r in records for k in r if k.startswith("reward/") and k.endswith("/mean")} - {"weighted"})


def _steps(records: Sequence[dict[str, Any]], key: str) -> list[tuple[int, float]]:
    """``(step, value)`` of the records with a finite ``key`` (a record without a step: its
    position, from 1)."""
    return [(int(r["step"]) if _finite(r.get("step")) else i, float(r[key]))
            for i, r in enumerate(records, 1) if _finite(r.get(key))]


def _drift(values: Sequence[Any]) -> dict[str, float] | None:
    """Median of the last fifth of the finite positive ``values`` over that of the first fifth
    (at least 2 values each), with the count; None for fewer than 4 values."""
    kept = [float(v) for v in values if _finite(v) and v > 0]
    if len(kept) < 4:
        return None
    window = max(2, len(kept) // 5)
    first, last = float(np.median(kept[:window])), float(np.median(kept[-window:]))
    return {"first": first, "last": last, "ratio": last / first, "steps": len(kept), "window": window}


def _trend(means: Sequence[float], stds: Sequence[float]) -> dict[str, float] | None:
    """Mean of the first and of the last fifth of a reward's step means, the change, and the
    reward's range as the run saw it (see :attr:`Thresholds.falling`); None without a std."""
    if not means or not stds:
        return None
    window = max(1, len(means) // 5)
    first, last = float(np.mean(means[:window])), float(np.mean(means[-window:]))
    seen = max(2 * max(stds), max(means) - min(means))
    return {"first": first, "last": last, "change": last - first, "range": seen,
            "relative": (last - first) / seen if seen > 0 else 0.0, "steps": len(means), "window": window}


def _correlations(records: Sequence[dict[str, Any]], names: Sequence[str]) -> np.ndarray | None:
    """Each step's correlation matrix ``[S, K, K]``, NaN where undefined: logged as None, or
    (logs written before undefined entries were None) a pair with a component that varied in no
    group of that step, whose 0 stood for "undefined"."""
    mats = []
    for r in records:
        if not r.get("reward_correlation"):
            continue
        m = np.array([[np.nan if v is None else v for v in row] for row in r["reward_correlation"]], float)
        k = len(m)
        active = np.array([
            r[f"active_fraction/{names[i]}"] > 0 if i < len(names) and _finite(r.get(f"active_fraction/{names[i]}"))
            else bool(np.isfinite(m[i, i]) and m[i, i] != 0) for i in range(k)])
        off = ~np.eye(k, dtype=bool)
        m[off & ~(active[:, None] & active[None, :])] = np.nan
        mats.append(m)
    return np.stack(mats) if mats else None


def summarise(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The numbers the conditions are judged on: means over the logged steps, and the per-step
    series of the conditions judged step by step."""
    names = _names(records)
    out: dict[str, Any] = {"steps": len(records), "names": names}
    out["cov_share"] = {n: _mean(records, f"cov_share/{n}") for n in names}
    out["cov_share_steps"] = {n: _steps(records, f"cov_share/{n}") for n in names}
    out["active_fraction"] = {n: _mean(records, f"active_fraction/{n}") for n in names}
    out["reward_std"] = {n: _mean(records, f"reward/{n}/std") for n in names}
    for key in ("k_eff/mean", "zero_variance_fraction", "c_q/median", "update_norm", "grad_norm"):
        out[key] = _mean(records, key)
    out["grad_norm_drift"] = _drift([r.get("grad_norm") for r in records])
    out["c_q_drift"] = _drift([r.get("c_q/median") for r in records])
    out["reward_trend"] = {}
    for n in [*names, "weighted"]:
        means = [v for _, v in _steps(records, f"reward/{n}/mean")]
        stds = [v for _, v in _steps(records, f"reward/{n}/std")]
        out["reward_trend"][n] = _trend(means, stds)
    stack = _correlations(records, names)
    if stack is not None:
        finite = np.isfinite(stack)
        counts = finite.sum(axis=0)
        out["correlation"] = np.where(counts > 0, np.where(finite, stack, 0.0).sum(axis=0) / np.maximum(counts, 1),
                                      np.nan)
        out["correlation_steps"] = counts
        out["diagonal_zero_always"] = [bool(np.all(np.nan_to_num(stack[:, k, k]) == 0)) for k in range(stack.shape[1])]
    return out


def _step_ranges(steps: Sequence[int]) -> str:
    """``[3, 4, 5, 9]`` -> ``"3-5, 9"``."""
    parts: list[str] = []
    start = prev = None
    for s in sorted(steps):
        if prev is not None and s == prev + 1:
            prev = s
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = s
    if start is not None:
        parts.append(str(start) if start == prev else f"{start}-{prev}")
    return ", ".join(parts)


def _dominant(run: str, s: dict[str, Any], t: Thresholds, estimator: str | None) -> Finding | None:
    # the steps with a covariance to share (one where no group varied logs 0 for every share)
    logged = {step for series in s["cov_share_steps"].values() for step, v in series if v != 0}
    if not logged:
        return None
    held = {n: [step for step, v in series if v >= t.dominant_share and step in logged]
            for n, series in s["cov_share_steps"].items()}
    top = max(held, key=lambda n: len(held[n]))
    fraction = len(held[top]) / len(logged)
    if not held[top] or fraction < t.dominant_steps:
        return None
    mean = s["cov_share"][top]
    key = "dominant_per_reward" if estimator in PER_REWARD_ESTIMATORS else None
    spread = s.get("reward_std", {})
    others = [v for n, v in spread.items() if n != top and v]
    ratio = spread[top] / float(np.median(others)) if spread.get(top) and others else None
    if key is None and ratio is not None and ratio < t.dominant_scale_ratio:
        key = "dominant_same_scale"  # a share not bought by a larger range (e.g. rewards that trade off)
    return Finding(
        "dominant", run,
        f"{top} holds >= {t.dominant_share:.0%} of GRPO's covariance sum in {len(held[top])} of {len(logged)} "
        f"steps (steps {_step_ranges(held[top])}; its mean over the run {mean:.0%})",
        {"component": top, "steps": held[top], "fraction": fraction, "cov_share": s["cov_share"],
         "std_ratio": ratio},
        advice_key=key,
    )


def _duplicates(run: str, s: dict[str, Any], t: Thresholds) -> list[Finding]:
    corr, names = s.get("correlation"), s["names"]
    found = []
    if corr is None:
        return found
    for a in range(min(len(corr), len(names))):
        for b in range(a + 1, min(len(corr), len(names))):
            value, steps = corr[a, b], int(s["correlation_steps"][a, b])
            if np.isfinite(value) and value >= t.duplicate_correlation:
                found.append(Finding(
                    "duplicates", run,
                    f"{names[a]} and {names[b]} have a mean within-group correlation of {value:.2f} over the "
                    f"{steps} of {s['steps']} steps where both varied in a group (threshold {t.duplicate_correlation})",
                    {"components": [names[a], names[b]], "correlation": float(value), "steps": steps}))
    return found


def _falling(run: str, s: dict[str, Any], t: Thresholds, estimator: str | None) -> Finding | None:
    trends = s["reward_trend"]
    fell = {n: tr for n in s["names"] if (tr := trends.get(n)) is not None
            and tr["steps"] >= t.falling_min_steps and tr["relative"] <= -t.falling}
    if not fell:
        return None
    window, steps = next(iter(fell.values()))["window"], next(iter(fell.values()))["steps"]
    parts = [f"{n} fell from {tr['first']:.3g} to {tr['last']:.3g} (by {-tr['relative']:.0%} of its range of "
             f"{tr['range']:.3g} in the run)" if i == 0 else
             f"{n} from {tr['first']:.3g} to {tr['last']:.3g} ({-tr['relative']:.0%} of {tr['range']:.3g})"
             for i, (n, tr) in enumerate(fell.items())]
    total = trends.get("weighted")
    also = ""
    if total:
        also = f", while the weighted total {'rose' if total['change'] > 0 else 'fell'} from {total['first']:.3g} to {total['last']:.3g}"
    return Finding(
        "falling", run,
        f"{'; '.join(parts)}: means of the first and last {window} of {steps} steps{also}",
        {"components": fell, "weighted": total},
        advice_key="falling_per_reward" if estimator in PER_REWARD_ESTIMATORS else None,
    )


def _never_varies(run: str, s: dict[str, Any], t: Thresholds) -> Finding | None:
    idle: dict[str, float | None] = {}  # one finding for them all: the advice is the same
    for k, n in enumerate(s["names"]):
        active = s["active_fraction"].get(n)
        never = active <= t.never_varies if active is not None else (
            k < len(s.get("diagonal_zero_always", [])) and s["diagonal_zero_always"][k])
        if never:
            idle[n] = active
    if not idle:
        return None
    parts = [f"{n} {'never' if not a else f'in {a:.1%} of the groups'}" for n, a in idle.items()]
    verb = "varies" if len(idle) == 1 else "vary"
    return Finding("never_varies", run, f"{'; '.join(parts)}: {verb} within a group (over {s['steps']} steps)",
                   {"components": list(idle), "active_fraction": idle})


def _c_q_far(run: str, s: dict[str, Any], t: Thresholds, estimator: str | None) -> Finding | None:
    c_q = s.get("c_q/median")
    if c_q is None or t.c_q_low <= c_q <= t.c_q_high:
        return None
    bounds = f"outside [{t.c_q_low}, {t.c_q_high}]"
    if estimator == "corrgrpo":
        return Finding("c_q_far", run, f"CorrGRPO's median c_q is {c_q:.2f} ({bounds})", {"c_q_median": c_q})
    if estimator is None:
        return Finding("c_q_far", run, f"the median c_q (CorrGRPO's factor over GRPO's advantages) is {c_q:.2f} "
                       f"({bounds}; the run's estimator is not in its logs)", {"c_q_median": c_q})
    return Finding("c_q_far", run, f"this {estimator} run's batches have a median c_q of {c_q:.2f} ({bounds}): "
                   "the factor CorrGRPO would have put on GRPO's advantages", {"c_q_median": c_q},
                   advice_key="c_q_far_other")


def _grad_drift(run: str, s: dict[str, Any], t: Thresholds, estimator: str | None) -> Finding | None:
    drift = s.get("grad_norm_drift")
    if drift is None or drift["steps"] < t.grad_drift_min_steps or 1 / t.grad_drift < drift["ratio"] < t.grad_drift:
        return None
    c_q_drift = s.get("c_q_drift") if estimator in (None, "corrgrpo") else None
    also = f"; CorrGRPO's median c_q {c_q_drift['first']:.3g} -> {c_q_drift['last']:.3g}" if c_q_drift else ""
    rising = drift["ratio"] > 1
    return Finding(
        "grad_drift", run,
        f"the gradient norm {'rose' if rising else 'fell'} from {drift['first']:.3g} to {drift['last']:.3g} "
        f"({drift['ratio']:.2f}x; medians of the first and last {drift['window']} of {drift['steps']} steps "
        f"with a gradient){also}",
        {"grad_norm": {**drift, "direction": "rising" if rising else "falling"}, "c_q_median": c_q_drift},
        advice_key=None if rising else "grad_drift_falling",
    )


def _run_findings(run: str, s: dict[str, Any], t: Thresholds, estimator: str | None = None) -> list[Finding]:
    found: list[Finding | None] = [_dominant(run, s, t, estimator), *_duplicates(run, s, t),
                                   _falling(run, s, t, estimator)]
    k_eff, names = s.get("k_eff/mean"), s["names"]
    if k_eff is not None and len(names) > 1 and k_eff <= t.k_eff_near_one:
        found.append(Finding("k_eff_one", run, f"K_eff is {k_eff:.2f} for {len(names)} rewards (mean over "
                             f"{s['steps']} steps)", {"k_eff": k_eff, "components": len(names)}))
    found.append(_never_varies(run, s, t))
    zero = s.get("zero_variance_fraction")
    if zero is not None and zero >= t.zero_variance:
        found.append(Finding("zero_variance", run, f"{zero:.0%} of the groups have no reward variance (mean "
                             f"over {s['steps']} steps)", {"zero_variance_fraction": zero}))
    found += [_c_q_far(run, s, t, estimator), _grad_drift(run, s, t, estimator)]
    return [f for f in found if f is not None]


def examine(run_dirs: Sequence[str | Path], thresholds: Thresholds | None = None) -> Report:
    """Read each run and judge it: the runs as read, their findings, then those comparing the
    runs (update norms)."""
    t = thresholds or Thresholds()
    runs: list[RunInfo] = []
    findings: list[Finding] = []
    norms: dict[str, float] = {}
    for run_dir in run_dirs:
        log = read_run(run_dir)
        runs.append(RunInfo(str(run_dir), log.kind, log.estimator, len(log.records), str(log.path)))
        summary = summarise(log.records)
        findings += _run_findings(str(run_dir), summary, t, log.estimator)
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
    return Report(runs, findings)


def advise(run_dirs: Sequence[str | Path], thresholds: Thresholds | None = None) -> list[Finding]:
    """The findings of each run, then those comparing the runs (:func:`examine`'s findings)."""
    return examine(run_dirs, thresholds).findings
