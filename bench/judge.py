"""What the bounded judge costs: verdicts in the training process versus in judge workers.

For every task of a code data set, the reference solution runs once in the sandbox
(as a candidate would); its run is then judged ``--repeats`` times in this process
(:func:`corrgrpo_envs.code.judge.judge`, no deadline) and as many times through a
:class:`~corrgrpo_envs.code.judge_pool.JudgePool` (what ``CodeEnv`` does). Prints
the mean and largest CPU time per verdict of this process and of the worker, the
wall time, and whether the two ways agree on every verdict. Then every probe of
:mod:`corrgrpo_envs.code.judge_probes` with its cost.

    python -m bench.judge                                     # HumanEval, 164 tasks
    python -m bench.judge --dataset PATH/LeetCodeDataset-v0.3.1-test.jsonl.gz --limit 100

Recorded with ``python -m bench.judge --limit 20 --no-probes`` (HumanEval, 100 verdicts each
way; a 2-core x86-64 machine shared with other jobs, CPython 3.11): through the pool a verdict
cost this process 0.183 ms of CPU on average (at most 0.5 ms) and the worker 0.200 ms; judged
in this process, 0.306 ms. This is the figure behind "the pool costs the host a fraction of a
millisecond per verdict"; the unit tests check the pool's verdicts, not its speed.
"""

from __future__ import annotations

import argparse
import statistics
import time

from bench.versions import format_versions, interpreter_versions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="humaneval")
    parser.add_argument("--limit", type=int, default=None, help="first N tasks")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--no-probes", action="store_true")
    args = parser.parse_args()
    print(format_versions("versions", interpreter_versions()), flush=True)

    import corrgrpo_envs
    from corrgrpo_envs.code import judge_probes
    from corrgrpo_envs.code.judge import judge
    from corrgrpo_envs.code.judge_pool import JudgePool

    env = corrgrpo_envs.make("corrgrpo/Code-v0", dataset=args.dataset, backend=args.backend, efficiency="off")
    u = env.unwrapped
    task_ids = u.task_ids[: args.limit]
    runs = []
    for task_id in task_ids:
        task = u.tasks.get(task_id)
        plan = u.verdicts.plan(task)
        runs.append((task, plan, u.sandbox.run(u.reference_program(task), u.limits)))
    print(f"{args.dataset}: {len(runs)} reference runs, {args.repeats} verdicts each way", flush=True)

    inline_cpu, pool_cpu, worker_cpu, inline_wall, pool_wall = [], [], [], [], []
    disagree = []
    statuses: dict[str, int] = {}
    with JudgePool(size=1) as pool:
        for task, plan, result in runs:
            pool.judge(task, plan, result)  # the worker loads the problem once
            for _ in range(args.repeats):
                wall, cpu = time.perf_counter(), time.process_time()
                mine = judge(task, plan, result)
                inline_cpu.append(time.process_time() - cpu)
                inline_wall.append(time.perf_counter() - wall)
                wall, cpu = time.perf_counter(), time.process_time()
                theirs, worker = pool.judge_with_cost(task, plan, result)
                pool_cpu.append(time.process_time() - cpu)
                pool_wall.append(time.perf_counter() - wall)
                worker_cpu.append(worker or 0.0)
                if mine != theirs:
                    disagree.append((task.id, mine, theirs))
            statuses[theirs] = statuses.get(theirs, 0) + 1

    def ms(xs: list[float]) -> str:
        return f"mean {1e3 * statistics.fmean(xs):7.3f} ms, max {1e3 * max(xs):7.1f} ms"

    print(f"in this process : CPU {ms(inline_cpu)}; wall {ms(inline_wall)}")
    print(f"judge worker    : CPU here {ms(pool_cpu)}; worker CPU {ms(worker_cpu)}; wall {ms(pool_wall)}")
    print(f"verdicts: {dict(sorted(statuses.items()))}; disagreements: {len(disagree)} {disagree[:5]}")
    env.close()

    if not args.no_probes:
        print("probes (host CPU = this process + the judge worker):")
        for name, probe in judge_probes.PROBES.items():
            held, detail = probe(backend=args.backend)
            print(f"  {name:26s} {'held' if held else 'BROKEN'}: {detail}", flush=True)


if __name__ == "__main__":
    main()
