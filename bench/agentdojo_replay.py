"""Ground-truth replays through ``corrgrpo/AgentDojo-v0`` versus AgentDojo's own runner.

For the same cases, side by side in one run:

* ours: ``reset`` on the case, ``reference_action`` (the user task's ground-truth
  calls as Hermes tool calls, then its expected answer), one ``step`` per message;
* AgentDojo: ``suite.run_task_with_pipeline`` with its ``GroundTruthPipeline`` and the
  case's injections (from the same attack classes of AgentDojo's registry).

Both start cold (no cached environments, attacks or injections). Prints episodes per
second of each, their ratio, and whether the two agree on utility and attack success
for every case.

    python -m bench.agentdojo_replay                      # every 10th of the 1995 cases (200 cases)
    python -m bench.agentdojo_replay --every 1            # all 1995 cases (several minutes)
    python -m bench.agentdojo_replay --suites banking,slack --every 1
"""

from __future__ import annotations

import argparse
import time

import corrgrpo_envs
from corrgrpo_envs.agentdojo import attacks as attack_cache
from corrgrpo_envs.agentdojo import episode as episode_cache
from corrgrpo_envs.agentdojo.attacks import _stub_pipeline
from corrgrpo_envs.agentdojo.cases import DEFAULT_ATTACKS, Case


def run_ours(
    env, task_ids: list[str], repeats: int = 1
) -> tuple[float, dict[str, tuple[bool, bool]]]:
    u = env.unwrapped
    attack_cache.clear_caches()
    episode_cache.clear_caches()
    verdicts = {}
    start = time.perf_counter()
    for task_id in [t for t in task_ids for _ in range(repeats)]:
        env.reset(options={"task_id": task_id})
        for action in u.reference_action(task_id):
            _, _, terminated, truncated, info = env.step(action)
            if terminated or truncated:
                break
        verdicts[task_id] = (info["utility_check"], bool(info["attack_success"]))
    return time.perf_counter() - start, verdicts


def run_agentdojo(
    suites: dict, task_ids: list[str], model_name: str
) -> tuple[float, dict[str, tuple[bool, bool]]]:
    import agentdojo.attacks  # noqa: F401
    from agentdojo.agent_pipeline.ground_truth_pipeline import GroundTruthPipeline
    from agentdojo.attacks.attack_registry import load_attack

    attacks: dict[tuple[str, str], object] = {}
    verdicts = {}
    start = time.perf_counter()
    for task_id in task_ids:
        case = Case.from_id(task_id)
        suite = suites[case.suite]
        user_task = suite.get_user_task_by_id(case.user_task_id)
        injection_task, injections = None, {}
        if case.attacked:
            key = (case.suite, case.attack)
            if key not in attacks:
                attack = load_attack(case.attack, suite, _stub_pipeline())
                attack.model_name = model_name
                attacks[key] = attack
            injection_task = suite.get_injection_task_by_id(case.injection_task_id)
            injections = attacks[key].attack(user_task, injection_task)
        utility, success = suite.run_task_with_pipeline(
            GroundTruthPipeline(user_task), user_task, injection_task, injections
        )
        verdicts[task_id] = (bool(utility), bool(success) if case.attacked else False)
    return time.perf_counter() - start, verdicts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suites", default=None, help="comma-separated suites (default: all)")
    parser.add_argument("--attacks", default=",".join(DEFAULT_ATTACKS))
    parser.add_argument("--every", type=int, default=10, help="take every n-th case")
    parser.add_argument("--benchmark-version", default="v1.2.2")
    parser.add_argument(
        "--group-size", type=int, default=8, help="episodes per case in the grouped run (G)"
    )
    args = parser.parse_args()
    from bench.versions import format_versions, interpreter_versions

    print(format_versions("versions", interpreter_versions()), flush=True)

    env = corrgrpo_envs.make(
        "corrgrpo/AgentDojo-v0",
        benchmark_version=args.benchmark_version,
        suites=args.suites.split(",") if args.suites else None,
        attacks=[a for a in args.attacks.split(",") if a],
    )
    u = env.unwrapped
    task_ids = u.task_ids[:: max(1, args.every)]
    n_attacked = sum(t.count("/") == 3 for t in task_ids)
    print(f"{len(task_ids)} cases ({len(task_ids) - n_attacked} clean, {n_attacked} attacked)")

    agentdojo_s, theirs = run_agentdojo(u._suites, task_ids, u.model_name)
    ours_s, ours = run_ours(env, task_ids)
    ours_eps, agentdojo_eps = len(task_ids) / ours_s, len(task_ids) / agentdojo_s
    agree = sum(ours[t] == theirs[t] for t in task_ids)
    print(f"corrgrpo env   : {ours_s:8.2f} s  {ours_eps:8.1f} episodes/s")
    print(f"AgentDojo      : {agentdojo_s:8.2f} s  {agentdojo_eps:8.1f} episodes/s")
    print(f"ratio (ours / AgentDojo): {ours_eps / agentdojo_eps:.2f}x")
    print(f"verdicts agree on {agree}/{len(task_ids)} cases")
    # Training plays each case G times in a row (one group); AgentDojo's runner
    # reloads everything per episode, so its per-episode cost is the one above.
    g = max(1, args.group_size)
    grouped_ids = task_ids[:: max(1, len(task_ids) // 50)]
    grouped_s, _ = run_ours(env, grouped_ids, repeats=g)
    grouped_eps = g * len(grouped_ids) / grouped_s
    print(
        f"corrgrpo env, {g} episodes per case ({len(grouped_ids)} cases): "
        f"{grouped_s:8.2f} s  {grouped_eps:8.1f} episodes/s"
        f"  ratio {grouped_eps / agentdojo_eps:.2f}x"
    )


if __name__ == "__main__":
    main()
