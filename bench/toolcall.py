"""Benchmark tool-call scoring: scored answers per second on RLLA-4K and API-Bank.

For each data set, three answer sets are scored: the ground-truth answers,
perturbed answers (a wrong value, a missing parameter, a wrong name, an extra
call, a broken tag, one of each per task in turn) and the same through
``env.step``. The baseline, timed side by side on the same texts, is
``json.loads`` of every tool-call line (the least any scorer must do), so the
ratio says what the full four-reward scoring costs on top of reading the JSON.

    python -m bench.toolcall [--repeats 5] [--data ../shared/data]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

from corrgrpo_envs.toolcall.answer_format import TOOL_CLOSE, render_answer
from corrgrpo_envs.toolcall.datasets import DATASETS, shared_data_dir
from corrgrpo_envs.toolcall.env import ToolCallEnv
from corrgrpo_envs.toolcall.rewards import score_answer


def _perturb(calls: list[dict], kind: int, answer: str) -> str:
    if not calls or kind == 4:
        return answer.replace(TOOL_CLOSE, "")  # broken tag
    first = dict(calls[0])
    params = dict(first["parameters"])
    if kind == 0 and params:
        params[next(iter(params))] = "__wrong__"
    elif kind == 1 and params:
        params.pop(next(iter(params)))
    elif kind == 2:
        first["name"] += "_x"
    else:
        return render_answer([*calls, {"name": "extra", "parameters": {}}])
    first["parameters"] = params
    return render_answer([first, *calls[1:]])


def _json_lines_only(answer: str) -> int:
    body = answer.split("<tool_call>", 1)[-1].split(TOOL_CLOSE, 1)[0]
    n = 0
    for line in body.splitlines():
        if line.strip():
            try:
                json.loads(line)
                n += 1
            except json.JSONDecodeError:
                pass
    return n


def _rate(fn: Callable[[], int], n: int, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return n / best


def bench(name: str, source, repeats: int) -> None:
    env = ToolCallEnv(dataset=source)
    tasks = list(env.tasks)
    truth = [t.get("ground_truth") or env.reference_action(t.id)[0] for t in tasks]
    perturbed = [_perturb(t["expected_calls"], i % 5, a) for i, (t, a) in enumerate(zip(tasks, truth))]
    for label, answers in (("ground truth", truth), ("perturbed", perturbed)):
        pairs = list(zip(tasks, answers))
        base = _rate(lambda p=pairs: sum(_json_lines_only(a) for _, a in p), len(pairs), repeats)
        score = _rate(
            lambda p=pairs: sum(
                score_answer(a, t["expected_calls"], t["expects_response"]).exact for t, a in p
            ),
            len(pairs),
            repeats,
        )

        def steps(p=pairs) -> int:
            for t, a in p:
                env.reset(options={"task_id": t.id})
                env.step(a)
            return len(p)

        step = _rate(steps, len(pairs), repeats)
        print(
            f"{name:<12} {label:<13} n={len(pairs):4d}  json.loads only {base:9.0f}/s  "
            f"score_answer {score:8.0f}/s ({score / base:.2f}x)  env.step {step:8.0f}/s ({step / base:.2f}x)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--data", type=Path, default=None, help="folder holding rlla_4k/ and api_bank/")
    args = parser.parse_args()
    from bench.versions import format_versions, interpreter_versions  # bench/versions.py
    print(format_versions("versions", interpreter_versions()), flush=True)
    data = args.data or shared_data_dir()
    if data is None or not (data / "rlla_4k").is_dir():
        raise SystemExit("reference data not found; pass --data or set CORRGRPO_DATA")
    bench("rlla_test", DATASETS.load(data / "rlla_4k" / "test.jsonl"), args.repeats)
    bench("rlla_sft", DATASETS.load(data / "rlla_4k" / "rlla_sft.json"), args.repeats)
    for level in (1, 2, 3):
        path = data / "api_bank" / f"level-{level}-api_processed.json"
        bench(f"api_bank_l{level}", DATASETS.load(path), args.repeats)
    bench("generated", DATASETS.load("generated", num_tasks=1000), args.repeats)


if __name__ == "__main__":
    main()
