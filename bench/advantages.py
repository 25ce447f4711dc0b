"""Benchmark the advantage estimators against a plain per-group loop reference.

A batch of N = 8192 responses (1024 groups x 8, shuffled group ids, 5 % NaN)
with K = 7 reward components. Each estimator of ``corrgrpo.trainer.estimators`` (with
its diagnostics, as the trainer calls it) is timed side by side with a
straightforward float64 reference that loops over the groups in Python; the
two must agree. Prints ms per call and the speed ratio.

    python -m bench.advantages [--groups 1024] [--group-size 8] [--components 7] [--threads 1]

One torch thread by default: at this size (N x K = 57k values) intra-op
parallelism gains little, and on a shared, oversubscribed CPU its thread
hand-offs can make each call 100x slower.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np
import torch

from bench.versions import format_versions, interpreter_versions
from corrgrpo.trainer.estimators import compute_advantages

EPS = 1e-6
ACTIVITY_RTOL = 1e-12


# --------------------------------------------------------------------------- #
# Reference: one group at a time, numpy float64, written from docs/method.md
# --------------------------------------------------------------------------- #
def _group_parts(s: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Centred weighted components (NaN -> 0), covariance, active mask of one group."""
    n = s.shape[0]
    centred = np.nan_to_num(s - np.nanmean(s, axis=0), nan=0.0) if n else s
    cov = centred.T @ centred / max(n - 1, 1)
    scale = np.maximum(1.0, np.nan_to_num(np.abs(s), nan=0.0).max(axis=0)) ** 2
    active = np.diag(cov) > ACTIVITY_RTOL * scale
    centred = centred * active  # a constant component centres to exactly 0
    return centred, centred.T @ centred / max(n - 1, 1), active


def _corr_sum(cov: np.ndarray, active: np.ndarray) -> float:
    total = 0.0
    k = cov.shape[0]
    for a in range(k):
        for b in range(k):
            if active[a] and active[b]:
                total += cov[a, b] / np.sqrt(cov[a, a] * cov[b, b])
    return max(0.0, total)


def _z(r: np.ndarray, active: np.ndarray) -> np.ndarray:
    centred = np.nan_to_num(r - np.nanmean(r, axis=0), nan=0.0)
    std = np.sqrt((centred**2).sum(axis=0) / max(r.shape[0] - 1, 1))
    return np.where(active, centred / (std + EPS), 0.0)


def reference(rewards: np.ndarray, group_ids: np.ndarray, weights: np.ndarray, name: str) -> np.ndarray:
    """Per-group loop implementation of the estimator ``name``."""
    s_all = rewards * weights
    out = np.zeros(len(rewards))
    zsum = np.zeros(len(rewards))
    zcols = np.zeros_like(rewards)
    for gid in np.unique(group_ids):
        rows = np.nonzero(group_ids == gid)[0]
        centred, cov, active = _group_parts(s_all[rows])
        numerator = centred.sum(axis=1)
        if name == "grpo":
            out[rows] = numerator / (np.sqrt(max(cov.sum(), 0.0)) + EPS)
        elif name == "dr_grpo":
            out[rows] = numerator
        elif name == "corrgrpo":
            out[rows] = numerator / np.sqrt(_corr_sum(cov, active) + EPS)
        else:
            z = _z(rewards[rows], active) * weights
            zcols[rows] = z
            zsum[rows] = z.sum(axis=1)
    valid = ~np.isnan(rewards).all(axis=1)
    if name == "mo_grpo":
        out = zsum
    elif name == "gdpo":
        out = (zsum - zsum[valid].mean()) / (zsum[valid].std(ddof=1) + EPS)
    elif name == "gdpo_corr":
        cols = zcols[valid]
        cov = np.cov(cols, rowvar=False)
        active = np.diag(cov) > ACTIVITY_RTOL * np.maximum(1.0, np.abs(cols).max(axis=0)) ** 2
        out = (zsum - zsum[valid].mean()) / np.sqrt(_corr_sum(cov, active) + EPS)
    return np.where(valid, out, 0.0)


# --------------------------------------------------------------------------- #
def _time(fn: Callable[[], object], min_seconds: float, max_calls: int) -> float:
    """Median seconds per call over repeated calls (after one warm-up call)."""
    fn()
    times = []
    start = time.perf_counter()
    while len(times) < max_calls and (time.perf_counter() - start < min_seconds or len(times) < 3):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=1024)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--components", type=int, default=7)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (default 1; 0: leave as is)"
    )
    parser.add_argument("--seconds", type=float, default=1.0, help="timing budget per estimator")
    args = parser.parse_args()
    print(format_versions("versions", interpreter_versions()), flush=True)
    if args.threads:
        torch.set_num_threads(args.threads)

    rng = np.random.default_rng(0)
    n, k = args.groups * args.group_size, args.components
    # mixed scales and binary components, like real agent rewards
    rewards = rng.normal(size=(n, k)) * rng.uniform(0.1, 10.0, size=k)
    rewards[:, : k // 2] = (rewards[:, : k // 2] > 0).astype(float)
    rewards[rng.random((n, k)) < 0.05] = np.nan
    group_ids = rng.permutation(np.repeat(np.arange(args.groups) * 3 + 7, args.group_size))
    weights = rng.uniform(0.5, 2.0, size=k)
    r_t, g_t, w_t = torch.from_numpy(rewards), torch.from_numpy(group_ids), torch.from_numpy(weights)

    print(
        f"N = {n} ({args.groups} groups x {args.group_size}), K = {k}, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads"
    )
    print(f"{'estimator':<10} {'vectorised ms':>14} {'loop ms':>10} {'speed-up':>9} {'max |diff|':>11}")
    for name in ("corrgrpo", "grpo", "dr_grpo", "gdpo", "mo_grpo", "gdpo_corr"):
        fast = compute_advantages(r_t, g_t, name, weights=w_t).advantages.numpy()
        slow = reference(rewards, group_ids, weights, name)
        diff = float(np.abs(fast - slow).max())
        if not np.allclose(fast, slow, rtol=1e-4, atol=1e-4):
            raise SystemExit(f"{name}: vectorised and loop results disagree (max |diff| {diff:.3g})")
        t_fast = _time(lambda name=name: compute_advantages(r_t, g_t, name, weights=w_t), args.seconds, 200)
        t_slow = _time(lambda name=name: reference(rewards, group_ids, weights, name), args.seconds, 5)
        print(
            f"{name:<10} {t_fast * 1e3:>14.2f} {t_slow * 1e3:>10.1f} "
            f"{t_slow / t_fast:>8.0f}x {diff:>11.1e}"
        )


if __name__ == "__main__":
    main()
