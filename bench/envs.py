"""Steps per second of the toy domain and of GroupedVectorEnv with 1 vs 2 workers.

    python -m bench.envs [--groups 64] [--group-size 8] [--rounds 20]

A step here is one member's reset + step (a single-turn episode). Ratios are
against baselines measured in the same run: the bare scoring function for the
single env, and one thread for GroupedVectorEnv.
"""

from __future__ import annotations

import argparse
import random
import time

import corrgrpo_envs
from corrgrpo_envs.toy.env import score_text
from corrgrpo_envs.vector import GroupedVectorEnv

TOY = "corrgrpo/ScaleDominance-v0"


def random_texts(n: int, seed: int = 0) -> list[str]:
    """Strings like a tiny model's 32-token answers: words and numbers, about 80 characters."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        toks = [
            str(rng.randint(0, 9999)) if rng.random() < 0.3
            else "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(1, 8)))
            for _ in range(rng.randint(8, 16))
        ]
        out.append(" ".join(toks))
    return out


def best_of(repeats: int, fn) -> float:
    """Best wall time of ``repeats`` runs (least disturbed by other load)."""
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=int, default=64)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=20, help="reset+step rounds per measurement")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    from bench.versions import format_versions, interpreter_versions  # bench/versions.py
    print(format_versions("versions", interpreter_versions()), flush=True)
    n = args.groups * args.group_size
    texts = random_texts(n)

    def bare():
        for t in texts:
            score_text(t)

    env = corrgrpo_envs.make(TOY)

    def single():
        for t in texts:
            env.reset()
            env.step(t)

    t_bare = best_of(args.repeats, bare)
    t_env = best_of(args.repeats, single)
    print(f"toy, {n} single-turn episodes (best of {args.repeats})")
    print(f"  score_text only       {n / t_bare:12,.0f} steps/s   1.00x")
    print(f"  env reset+step        {n / t_env:12,.0f} steps/s   {t_bare / t_env:.2f}x")

    print(f"GroupedVectorEnv {args.groups} x {args.group_size}, {args.rounds} rounds of reset+step")
    baseline = None
    for executor, workers in (("thread", 1), ("thread", 2), ("process", 1), ("process", 2)):
        with GroupedVectorEnv(TOY, args.groups, args.group_size, workers=workers, executor=executor) as venv:
            venv.reset(seed=0)
            venv.step(texts)  # warm up

            def rounds(venv=venv):
                for r in range(args.rounds):
                    venv.reset(seed=r)
                    venv.step(texts)

            t = best_of(args.repeats, rounds)
        rate = n * args.rounds / t
        baseline = baseline or rate
        print(f"  {executor:7s} workers={workers}  {rate:12,.0f} steps/s   {rate / baseline:.2f}x")


if __name__ == "__main__":
    main()
