"""Does a model learn tool calling? Greedy evaluation of training stages on held-out data.

Each stage (the base model, an SFT checkpoint, an RL checkpoint) is evaluated with
``corrgrpo.trainer.evaluate.evaluate`` (the code of ``corrgrpo eval``), greedy, on data no
stage trains on:

* ``generated``: the built-in generator's eval split (the SFT and RL configs train on
  its train split; ``num_tasks``/``seed`` come from the config's env section);
* ``rlla_test``: the 80 RLLA-4K test rows;
* ``bfcl``: BFCL ``simple_python`` and ``multiple``, read from the bfcl-eval wheel in
  ``$BFCL_WHEEL_DIR`` (default ``.cache/bfcl``); ``bfcl_parallel`` and ``bfcl_live_simple``:
  BFCL's ``parallel`` and ``live_simple`` (parallel calls are scored in any order, as BFCL does);
* ``api_bank_l1``: API-Bank level 1 (399 rows);
* ``rlla_sft_eval``: the eval split of the RLLA SFT file (72 of its 400 records, by id hash),
  held out from an SFT or RL run on its train split.

``--prompt-format house`` renders every data set in one RLLA layout (the env's
``prompt_format`` option): use the layout the evaluated model trained on.

Every data set is a seeded sample of ``N`` tasks (``--data generated=200``), the same
for every stage. One result file per (stage, data set) is written under ``--out``
and reused on a later call (so an interrupted run continues), then ``report.json``
and ``report.md``: per stage and data set, all-exact accuracy with its 95 % Wilson
interval, the four reward components in percent, the number of tasks, the share of
answers with unreadable calls, and the wall time; then the stage pairs of ``--compare``
(default :data:`COMPARISONS`) task by task on each data set both stages have: call tasks
gained and lost, with McNemar's exact p. ``changes.md`` shows the answers of those gained and
lost tasks, both stages' side by side.

    OMP_NUM_THREADS=2 python -m studies.learning_toolcall \\
        --stage base=base --stage sft=runs/sft_toolcall_smollm2/checkpoint-60 \\
        --data generated=200 --data rlla_test=80 --data bfcl=200
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import zipfile
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = ROOT / "studies" / "configs" / "toolcall_smollm2.yaml"
BFCL_CATEGORIES = ("simple_python", "multiple")
#: the BFCL data sets of ``--data`` and their categories
BFCL_SETS = {"bfcl": BFCL_CATEGORIES, "bfcl_parallel": ("parallel",), "bfcl_live_simple": ("live_simple",)}
#: the other data sets of ``--data``: (``env.dataset``, split)
FIXED_SETS = {"generated": ("generated", "eval"), "rlla_test": ("rlla_test", "all"),
              "api_bank_l1": ("api_bank_l1", "all"), "rlla_sft_eval": ("rlla_sft", "eval")}
COMPONENTS = ("function_name", "parameter", "values", "format")
#: stage pairs compared task by task when both are in the folder (after, before): docs/learning.md's stages
COMPARISONS = (
    ("sft60", "base"),
    ("rl_grpo10", "sft60"), ("rl_corrgrpo10", "sft60"), ("rl_corrgrpo10", "rl_grpo10"),
    ("rl_grpo30", "sft60"), ("rl_corrgrpo30", "sft60"), ("rl_corrgrpo30", "rl_grpo30"),
    ("rl_grpo30", "rl_grpo10"), ("rl_corrgrpo30", "rl_corrgrpo10"),
)


# ---------------------------------------------------------------------------- data sets
def bfcl_folder(out: Path, wheel_dir: Path | None = None, categories: tuple[str, ...] = BFCL_CATEGORIES,
                name: str = "bfcl") -> Path:
    """A BFCL data folder (``out/bfcl_data`` for the default categories, else
    ``out/<name>_data``) with the ``categories``' question files and their answers, extracted
    from the newest ``bfcl_eval-*.whl`` in ``wheel_dir``."""
    wheel_dir = wheel_dir or Path(os.environ.get("BFCL_WHEEL_DIR", ROOT / ".cache" / "bfcl"))
    wheels = sorted(Path(wheel_dir).glob("bfcl_eval-*.whl"))
    if not wheels:
        raise FileNotFoundError(
            f"no bfcl_eval-*.whl in {wheel_dir} (pip download --no-deps bfcl-eval -d {wheel_dir}, "
            "or set BFCL_WHEEL_DIR)"
        )
    target = out / ("bfcl_data" if name == "bfcl" else f"{name}_data")
    with zipfile.ZipFile(wheels[-1]) as zf:
        for category in categories:
            for sub in ("", "possible_answer/"):
                name = f"bfcl_eval/data/{sub}BFCL_v4_{category}.json"
                dest = target / sub / Path(name).name
                if not dest.exists():
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    dest.write_bytes(zf.read(name))
    return target


def dataset_overrides(name: str, out: Path) -> tuple[list[str], str]:
    """Config overrides and split that select data set ``name``."""
    if name in FIXED_SETS:
        dataset, split = FIXED_SETS[name]
        return [f"env.dataset={dataset}"], split
    if name in BFCL_SETS:
        return [f"env.dataset={bfcl_folder(out, categories=BFCL_SETS[name], name=name)}"], "all"
    raise ValueError(f"--data: unknown data set {name!r} ({', '.join([*FIXED_SETS, *BFCL_SETS])})")


def sample_ids(task_ids: list[str], n: int | None, seed: int) -> list[str]:
    """``n`` of ``task_ids`` drawn without replacement with ``seed``, in their original order
    (all of them when ``n`` is None or not smaller)."""
    if n is None or n >= len(task_ids):
        return list(task_ids)
    keep = np.random.default_rng(seed).choice(len(task_ids), size=n, replace=False)
    return [task_ids[i] for i in sorted(keep.tolist())]


# --------------------------------------------------------------------------- evaluation
def diagnostics(records: list[dict[str, Any]]) -> dict[str, Any]:
    """What the answers look like: unreadable-call share, the commonest errors, a sample."""
    errors = Counter(str(r["info"].get("error", ""))[:80] for r in records if r["info"].get("error"))
    return {
        "unreadable_share": 100.0 * sum(errors.values()) / max(len(records), 1),
        "has_tool_call_tag_share": 100.0 * float(np.mean(["<tool_call>" in r["text"] for r in records])),
        "mean_answer_chars": float(np.mean([len(r["text"]) for r in records])),
        "top_errors": errors.most_common(3),
        "sample_answer": records[0]["text"][:400] if records else "",
    }


def data_config(config: Path, data: str, out: Path, overrides: list[str] = ()) -> tuple[Any, str]:
    """The eval config pointed at data set ``data``, and the split to evaluate."""
    from corrgrpo.trainer.config import load_config

    selects, split = dataset_overrides(data, out)
    cfg = load_config(config, selects + list(overrides))
    if data != "generated":
        # the generator's options (prompt style, distractor tools) mean nothing to the file loaders
        cfg.env.dataset_options = None
    return cfg, split


def data_env(cfg: Any, split: str) -> Any:
    """The (unwrapped) env of ``cfg`` on ``split``."""
    import corrgrpo_envs

    return corrgrpo_envs.make(cfg.env, split=split).unwrapped


def mark_call_tasks(config: Path, results: list[dict[str, Any]], out: Path) -> None:
    """Give each saved answer without it ``expects_calls`` (files written before answers carried it)."""
    for data in sorted({r["data"] for r in results if any("expects_calls" not in a for a in r.get("answers", []))}):
        env = data_env(*data_config(config, data, out))
        calls = {t.id for t in env.tasks if t.data.get("expected_calls")}
        env.close()
        for r in results:
            if r["data"] == data:
                for a in r.get("answers", []):
                    a.setdefault("expects_calls", a["task_id"] in calls)


def evaluate_stage(
    config: Path, stage: str, source: str, data: str, n: int | None, args: argparse.Namespace
) -> dict[str, Any]:
    """Evaluate one stage on one data set (greedy); the result without per-episode texts."""
    import torch

    from corrgrpo.trainer.evaluate import evaluate

    cfg, split = data_config(config, data, args.out,
                             [f"rollout.max_new_tokens={args.max_new_tokens}", f"train.seed={args.seed}",
                              f"env.prompt_format={args.prompt_format}"])
    probe = data_env(cfg, split)
    ids = sample_ids(list(probe.task_ids), n, args.seed)
    probe.close()
    torch.set_num_threads(args.threads)
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    result = evaluate(
        cfg, checkpoint=None if source == "base" else source, split=split, greedy=True,
        batch_size=args.batch_size, progress=sys.stderr.isatty(), task_ids=ids,
    )
    records = result.pop("records")
    result.update(
        stage=stage, source=source, data=data, sample_seed=args.seed, max_new_tokens=args.max_new_tokens,
        prompt_format=args.prompt_format,
        torch_threads=torch.get_num_threads(), load_average_at_start=load,
        wall_seconds=time.perf_counter() - t0, diagnostics=diagnostics(records),
        answers=[
            {"task_id": r["task_id"], "text": r["text"], "rewards": r["reward_components"],
             "expects_calls": bool(r.get("info", {}).get("expects_calls", True)), "exact": answer_exact(r)}
            for r in records
        ],
    )
    return result


# ----------------------------------------------------------------------- train overlap
def generated_train_duplicates(config: Path) -> tuple[set[str], set[str]]:
    """Eval-split task ids of the generator whose user turn and expected calls equal a train-split
    task's (the generator's request space is small, so some recur), and the ids that expect calls."""
    import corrgrpo_envs
    from corrgrpo.trainer.config import load_config

    cfg = load_config(config, [])

    def key(task: Any) -> str:
        user = [m["content"] for m in task.data["messages"] if m["role"] == "user"]
        return json.dumps([user, task.data.get("expected_calls")], sort_keys=True)

    splits = {}
    for split in ("train", "eval"):
        env = corrgrpo_envs.make(cfg.env, split=split).unwrapped
        splits[split] = list(env.tasks)
        env.close()
    train_keys = {key(t) for t in splits["train"]}
    seen = {t.id for t in splits["eval"] if key(t) in train_keys}
    with_calls = {t.id for t in splits["eval"] if t.data.get("expected_calls")}
    return seen, with_calls


def unseen_accuracy(result: dict[str, Any], seen: set[str], with_calls: set[str]) -> dict[str, float]:
    """All-exact accuracy (with its Wilson interval) over the answered call tasks not seen in train."""
    from corrgrpo_envs.toolcall.metrics import wilson_interval

    pool = [a for a in result.get("answers", []) if a["task_id"] in with_calls and a["task_id"] not in seen]
    hits = sum(answer_exact(a) for a in pool)
    low, up = wilson_interval(hits, len(pool)) if pool else (float("nan"), float("nan"))
    return {"n": len(pool), "all_exact_accuracy": 100.0 * hits / max(len(pool), 1),
            "ci95_low": 100.0 * low, "ci95_high": 100.0 * up,
            "seen_call_tasks": len([a for a in result.get("answers", []) if a["task_id"] in with_calls & seen])}


# ------------------------------------------------------------------------- paired tests
def answer_exact(answer: dict[str, Any]) -> bool:
    """Whether an answer (a record, or a saved answer) gets every expected call exactly right.

    The env's own verdict (``info["exact"]``, or ``exact`` in a saved answer) where there is
    one; files written before answers carried it fall back to the three correctness rewards at
    their maxima.
    """
    from corrgrpo_envs.toolcall.rewards import REWARD_HIGH, REWARD_NAMES

    verdict = answer.get("exact", answer.get("info", {}).get("exact"))
    if verdict is not None:
        return bool(verdict)
    rewards = answer.get("rewards") or answer.get("reward_components") or {}
    return all(abs(float(rewards.get(n, 0.0)) - REWARD_HIGH[i]) < 1e-6 for i, n in enumerate(REWARD_NAMES[:3]))


def paired_exact(after: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    """Call tasks that became exact (gained) and stopped being exact (lost) from ``before`` to
    ``after`` on the same data set, with McNemar's exact p. A task that expects no call is never
    exact, so it can neither be gained nor lost; ``n`` counts the call tasks both stages answered
    (every answered task for files that do not say which tasks expect calls)."""
    def exact(result: dict[str, Any]) -> dict[str, bool]:
        return {a["task_id"]: answer_exact(a) for a in result["answers"] if a.get("expects_calls", True)}

    change = paired_change(exact(before), exact(after))
    return {"after": after["stage"], "before": before["stage"], "data": after["data"], **change,
            "net_points": 100.0 * (change["gained"] - change["lost"]) / max(change["n"], 1)}


def paired_change(before: dict[str, bool], after: dict[str, bool]) -> dict[str, Any]:
    """Over the task ids both stages have: how many went False -> True (gained) and True -> False
    (lost), with McNemar's exact p."""
    from corrgrpo_envs.metrics import mcnemar_exact

    common = before.keys() & after.keys()
    gained = sum(after[t] and not before[t] for t in common)
    lost = sum(before[t] and not after[t] for t in common)
    return {"n": len(common), "gained": gained, "lost": lost, "p": mcnemar_exact(gained, lost)}


def comparisons(results: list[dict[str, Any]], pairs: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """:func:`paired_exact` for every ``(after, before)`` pair and data set that both stages have."""
    by_key = {(r["stage"], r["data"]): r for r in results if r.get("answers")}
    datasets = sorted({r["data"] for r in results})
    return [paired_exact(by_key[(a, d)], by_key[(b, d)])
            for a, b in pairs for d in datasets if (a, d) in by_key and (b, d) in by_key]


def comparison_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| comparison | data set | call tasks | gained | lost | net (points) | p |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['after']} vs {r['before']} | {r['data']} | {r['n']} | {r['gained']} | {r['lost']} "
              f"| {r['net_points']:+.1f} | {r['p']:.2g} |" for r in rows]
    return "\n".join(lines) + "\n"


def changed_answers(after: dict[str, Any], before: dict[str, Any]) -> list[dict[str, Any]]:
    """The call tasks whose all-exact verdict differs between ``before`` and ``after`` (same data
    set), in ``after``'s task order: each with ``change`` ("gained" or "lost") and both answers."""
    old = {a["task_id"]: a for a in before["answers"] if a.get("expects_calls", True)}
    rows = []
    for answer in after["answers"]:
        prior = old.get(answer["task_id"])
        if prior is None or not answer.get("expects_calls", True):
            continue
        now, then = answer_exact(answer), answer_exact(prior)
        if now != then:
            rows.append({"task_id": answer["task_id"], "change": "gained" if now else "lost",
                         "before": prior.get("text", ""), "after": answer.get("text", "")})
    return rows


def changes_markdown(results: list[dict[str, Any]], pairs: list[tuple[str, str]], chars: int = 600) -> str:
    """Every changed verdict of every compared pair, both answers side by side (the first
    ``chars`` characters of each): what a gained or lost task looks like, not just how many."""
    by_key = {(r["stage"], r["data"]): r for r in results if r.get("answers")}
    datasets = sorted({r["data"] for r in results})
    parts = []
    for a, b in pairs:
        for d in datasets:
            if (a, d) not in by_key or (b, d) not in by_key:
                continue
            rows = changed_answers(by_key[(a, d)], by_key[(b, d)])
            parts.append(f"## {a} vs {b} on {d}: {sum(r['change'] == 'gained' for r in rows)} gained, "
                         f"{sum(r['change'] == 'lost' for r in rows)} lost\n")
            for r in rows:
                parts.append(f"### {r['task_id']} ({r['change']})\n\n{b}:\n\n```text\n{r['before'][:chars]}\n```\n\n"
                             f"{a}:\n\n```text\n{r['after'][:chars]}\n```\n")
    return "\n".join(parts)


# ------------------------------------------------------------------------------ report
def _rows(result: dict[str, Any]) -> list[tuple[str, dict[str, float]]]:
    """``(label, metrics)`` of a result: the whole data set, then each part when it has several."""
    metrics = result["metrics"]
    parts = sorted({k.split("/", 1)[0] for k in metrics if "/" in k})
    rows = [(result["data"], {k: v for k, v in metrics.items() if "/" not in k})]
    if len(parts) > 1:
        rows += [(p, {k.split("/", 1)[1]: v for k, v in metrics.items() if k.startswith(p + "/")}) for p in parts]
    return rows


def markdown_table(results: list[dict[str, Any]]) -> str:
    """The stage x data set table (all-exact with its 95 % Wilson interval, components in %)."""
    lines = [
        "| stage | data set | n (with calls / all) | all-exact % [95 % CI] | function_name | parameter | values | format | unreadable | wall |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for result in results:
        diag = result.get("diagnostics", {})
        for label, m in _rows(result):
            if "all_exact_accuracy" in m:
                exact = f"{m['all_exact_accuracy']:.1f} [{m['all_exact_ci95_low']:.1f}, {m['all_exact_ci95_high']:.1f}]"
            else:
                exact = "n/a"
            comps = " | ".join(f"{m[c]:.1f}" if c in m else "n/a" for c in COMPONENTS)
            whole = label == result["data"]
            unreadable = f"{diag.get('unreadable_share', float('nan')):.0f} %" if whole else ""
            wall = f"{result.get('wall_seconds', result.get('seconds', 0.0)):.0f} s" if whole else ""
            lines.append(
                f"| {result['stage']} | {label} | {int(m.get('num_with_calls', 0))} / {int(m.get('num_examples', 0))} "
                f"| {exact} | {comps} | {unreadable} | {wall} |"
            )
    return "\n".join(lines) + "\n"


def write_report(out: Path, results: list[dict[str, Any]], pairs: list[tuple[str, str]] = ()) -> None:
    """``report.json`` (results without answers, and the paired tests), ``report.md``, and
    ``changes.md`` (the answers of every task whose verdict a compared pair changed) in ``out``."""
    slim = [{k: v for k, v in r.items() if k != "answers"} for r in results]
    paired = comparisons(results, list(pairs))
    (out / "report.json").write_text(json.dumps({"results": slim, "paired": paired}, indent=2, default=str),
                                     encoding="utf-8")
    text = markdown_table(results)
    unseen = [r for r in results if r.get("unseen")]
    if unseen:
        text += ("\nGenerator eval split without the call tasks whose request and calls also occur in the "
                 "train split:\n\n| stage | unseen call tasks | all-exact % [95 % CI] | call tasks left out |\n"
                 "|---|---|---|---|\n")
        for r in unseen:
            u = r["unseen"]
            text += (f"| {r['stage']} | {u['n']} | {u['all_exact_accuracy']:.1f} [{u['ci95_low']:.1f}, "
                     f"{u['ci95_high']:.1f}] | {u['seen_call_tasks']} |\n")
    if paired:
        text += ("\nPaired on the same call tasks (all-exact; McNemar's exact test on the tasks that "
                 "changed):\n\n" + comparison_table(paired))
    (out / "report.md").write_text(text, encoding="utf-8")
    (out / "changes.md").write_text(changes_markdown(results, list(pairs)), encoding="utf-8")


def name_value_pairs(values: list[str], flag: str) -> list[tuple[str, str]]:
    """``NAME=VALUE`` command-line values as pairs; exits naming ``flag`` on a malformed one."""
    out = []
    for v in values:
        name, sep, rest = v.partition("=")
        if not sep or not name or not rest:
            raise SystemExit(f"{flag} {v!r}: expected NAME=VALUE")
        out.append((name, rest))
    return out


def stage_order(pairs: list[tuple[str, str]]) -> dict[str, int]:
    """Report position of each stage: first mention in ``pairs``, each read before -> after (a
    stage in no pair goes last)."""
    order: dict[str, int] = {}
    for after, before in pairs:
        for stage in (before, after):
            order.setdefault(stage, len(order))
    return order


def stage_pair(value: str) -> tuple[str, str]:
    """``AFTER:BEFORE`` of ``--compare``; exits naming the malformed value."""
    after, sep, before = value.partition(":")
    if not sep or not after or not before:
        raise SystemExit(f"--compare {value!r}: expected AFTER:BEFORE (two stage names)")
    return after, before


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="eval config (env and model sections)")
    parser.add_argument("--stage", action="append", default=[], help="NAME=base or NAME=checkpoint/model folder")
    parser.add_argument("--data", action="append", default=[],
                        help=f"NAME=N: {', '.join([*FIXED_SETS, *BFCL_SETS])}; N tasks (all: 0)")
    parser.add_argument("--prompt-format", default="source", choices=("source", "house"),
                        help="the env's prompt_format: each data set's own prompts, or all in the house RLLA layout")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "learning_toolcall")
    parser.add_argument("--max-new-tokens", type=int, default=144)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--seed", type=int, default=0, help="seed of the task samples")
    parser.add_argument("--redo", action="store_true", help="re-evaluate pairs that already have a result file")
    parser.add_argument("--compare", action="append", default=None, metavar="AFTER:BEFORE",
                        help="stages compared task by task on each data set both have "
                             f"(default: {' '.join(a + ':' + b for a, b in COMPARISONS)})")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    stages = name_value_pairs(args.stage, "--stage")
    data = [(name, int(n) or None) for name, n in name_value_pairs(args.data, "--data")]
    pairs = COMPARISONS if args.compare is None else [stage_pair(v) for v in args.compare]
    results = []
    for stage, source in stages:
        for name, n in data:
            path = args.out / f"{stage}-{name}.json"
            if path.exists() and not args.redo:
                results.append(json.loads(path.read_text(encoding="utf-8")))
                continue
            # a log file gets one line per pair before its (long) evaluation; a terminal also gets a bar
            print(f"{stage} {name}: evaluating {n or 'all'} tasks ...", flush=True)
            result = evaluate_stage(args.config, stage, source, name, n, args)
            path.write_text(json.dumps(result, indent=2, default=str), encoding="utf-8")
            results.append(result)
            write_report(args.out, results)
            print(f"{stage} {name}: {result['metrics'].get('all_exact_accuracy')} ({result['wall_seconds']:.0f} s)", flush=True)
    # the report covers every result in the folder (earlier calls' stages too)
    everything = [json.loads(f.read_text(encoding="utf-8")) for f in sorted(args.out.glob("*-*.json"))]
    order = stage_order(pairs)
    everything.sort(key=lambda r: (order.get(r["stage"], len(order)), r["stage"], r["data"]))
    if any(r["data"] == "generated" for r in everything):
        seen, with_calls = generated_train_duplicates(args.config)
        for r in everything:
            if r["data"] == "generated":
                r["unseen"] = unseen_accuracy(r, seen, with_calls)
    mark_call_tasks(args.config, everything, args.out)
    write_report(args.out, everything, pairs)
    print((args.out / "report.md").read_text(encoding="utf-8"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
