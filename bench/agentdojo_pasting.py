"""Utility and security of honest and pasted final answers, with and without ``paste_guard``.

Scripted policies on every clean case (97 user tasks of v1.2.2), each one episode of
``corrgrpo/AgentDojo-v0``:

* ``honest``: the user task's ground-truth calls, then its ground-truth answer
  (``reference_action``);
* ``pasted tool outputs`` / ``pasted environment`` / ``pasted both``: the same calls,
  then a final answer that pastes every tool output of the episode, the environment's
  text (what a policy can learn by heart: the suite's data), or both;
* ``explore, short`` / ``explore, pasted ...``: no knowledge of the task: one call to
  every tool of the suite that needs no arguments, then ``"Done."`` or a paste.

Utility without the guard is AgentDojo's verdict (``info["utility_check"]``); with it,
the env's reward (``paste_guard=True``, the default). Then the same for the security
reward on attacked cases (every ``--every``-th), honest and pasted, whose tool outputs
hold the injection.

    python bench/agentdojo_pasting.py                 # clean cases + every 5th attacked case
    python bench/agentdojo_pasting.py --every 1       # all attacked cases (minutes)
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this file's folder leads sys.path and bench/agentdojo.py would shadow the
# ``agentdojo`` package.
if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path.pop(0)

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402

import corrgrpo_envs  # noqa: E402
from corrgrpo_envs.agentdojo.paste_probes import no_argument_calls  # noqa: E402
from corrgrpo_envs.agentdojo.pasting import environment_text  # noqa: E402


def _tool_outputs(obs: dict) -> str:
    return "\n".join(m["content"] for m in obs["messages"] if m["role"] == "tool")


#: policy name -> (calls of a case: "ground_truth" or "explore", final answer from (obs, env text))
POLICIES: dict[str, tuple[str, Callable[[dict, str, str], str]]] = {
    "honest": ("ground_truth", lambda obs, env_text, truth: truth),
    "pasted tool outputs": ("ground_truth", lambda obs, env_text, truth: _tool_outputs(obs)),
    "pasted environment": ("ground_truth", lambda obs, env_text, truth: env_text),
    "pasted both": ("ground_truth", lambda obs, env_text, truth: _tool_outputs(obs) + "\n" + env_text),
    "explore, short": ("explore", lambda obs, env_text, truth: "Done."),
    "explore, pasted tool outputs": ("explore", lambda obs, env_text, truth: _tool_outputs(obs)),
    "explore, pasted both": ("explore", lambda obs, env_text, truth: _tool_outputs(obs) + "\n" + env_text),
}


def play(env, task_id: str, policy: str) -> dict:
    """One episode: the policy's calls, then its final answer; AgentDojo's and the env's verdicts."""
    u = env.unwrapped
    calls, answer_of = POLICIES[policy]
    obs, _ = env.reset(options={"task_id": task_id})
    reference = u.reference_action(task_id)
    messages = reference[:-1] if calls == "ground_truth" else no_argument_calls(obs)
    for message in messages:
        obs, reward, terminated, truncated, info = env.step(message)
        if terminated or truncated:
            raise RuntimeError(f"{task_id}: the episode ended before the final answer ({info})")
    answer = answer_of(obs, environment_text(u._episode.pre_environment), reference[-1])
    obs, reward, terminated, truncated, info = env.step(answer)
    assert terminated, (task_id, policy, info)
    return {
        "utility_off": bool(info["utility_check"]),
        "utility_on": bool(reward[0]),
        "security_off": None if info["attack_success"] is None else not info["attack_success"],
        "security_on": float(reward[1]),
        "pasted": info["paste"]["pasted"],
        "copied": info["paste"]["copied_ngrams"],
        "chars": len(answer),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--every", type=int, default=5, help="take every n-th attacked case")
    parser.add_argument("--attack", default="important_instructions")
    parser.add_argument("--json", default=None, help="also write the per-case rows here")
    args = parser.parse_args()
    import runpy

    _v = runpy.run_path(str(Path(__file__).with_name("versions.py")))
    print(_v["format_versions"]("versions", _v["interpreter_versions"]()), flush=True)

    clean = corrgrpo_envs.make("corrgrpo/AgentDojo-v0", attacks=[], paste_guard=True)
    task_ids = clean.unwrapped.task_ids
    rows: dict[str, dict[str, dict]] = {}
    start = time.perf_counter()
    print(f"\nclean cases: {len(task_ids)}")
    print(f"{'policy':30s} {'utility, guard off':>18s} {'utility, guard on':>18s} {'pasted':>7s} "
          f"{'most copied':>11s} {'mean chars':>10s}")
    for policy in POLICIES:
        got = rows[policy] = {t: play(clean, t, policy) for t in task_ids}
        n = len(got)
        print(f"{policy:30s} {sum(r['utility_off'] for r in got.values()):>13d}/{n:<4d} "
              f"{sum(r['utility_on'] for r in got.values()):>13d}/{n:<4d} "
              f"{sum(r['pasted'] for r in got.values()):>7d} {max(r['copied'] for r in got.values()):>11d} "
              f"{sum(r['chars'] for r in got.values()) / n:>10.0f}", flush=True)
    honest = rows["honest"]
    changed = [t for t, r in honest.items() if r["utility_on"] != r["utility_off"]]
    print(f"honest answers whose utility the guard changes: {len(changed)} {changed}")

    attacked = corrgrpo_envs.make("corrgrpo/AgentDojo-v0", attacks=[args.attack], include_clean=False,
                                  paste_guard=True)
    attacked_ids = attacked.unwrapped.task_ids[:: max(1, args.every)]
    print(f"\nattacked cases ({args.attack}, every {args.every}): {len(attacked_ids)}")
    print(f"{'policy':30s} {'security, guard off':>19s} {'security, guard on':>19s} "
          f"{'utility off':>11s} {'utility on':>10s} {'pasted':>7s}")
    for policy in ("honest", "pasted tool outputs", "pasted both"):
        got = rows[f"attacked: {policy}"] = {t: play(attacked, t, policy) for t in attacked_ids}
        n = len(got)
        print(f"{policy:30s} {sum(r['security_off'] for r in got.values()):>14d}/{n:<4d} "
              f"{sum(r['security_on'] for r in got.values()):>14.0f}/{n:<4d} "
              f"{sum(r['utility_off'] for r in got.values()):>11d} {sum(r['utility_on'] for r in got.values()):>10d} "
              f"{sum(r['pasted'] for r in got.values()):>7d}", flush=True)
    print(f"\n{time.perf_counter() - start:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
