"""The estimator study on the tool-call rewards (``corrgrpo/ToolCall-v0``), from a shared SFT warm start.

Rewards: ``function_name`` [-0.5, 0.5], ``parameter`` [-1, 1], ``values`` [-1.5, 1.5], ``format``
{0, 1} on the built-in generator with one listed tool per task beyond those needed and the short
system prompt (``env.dataset_options``), so a step takes seconds on 2 CPU cores.

1. ``init``: a random-init Qwen2 (:func:`corrgrpo.agents.models.build_tiny_model`) whose BPE tokenizer is
   trained on the generator's train split (prompts and reference answers), with a ChatML template
   that leaves the tools out of the system turn (the system prompt already lists them);
2. ``sft``: ``corrgrpo sft studies/configs/sft_toolcall_study.yaml`` from it (the warm start, trained once);
3. RL from the warm start with every estimator and seed (``studies/configs/study_toolcall.yaml``,
   only ``algorithm.estimator`` and ``train.seed`` change), through :mod:`study`'s runner;
4. greedy evaluation of the warm start and of every run's final model on the EVAL split;
5. :mod:`study`'s statistics (final training means, paired differences to GRPO with Holm's
   correction, the diagnostics c_q, covariance shares, K_eff) plus the same on the evaluation
   metrics, and the figure drawn by ``corrgrpo plot``.

Everything lands in ``runs/study_toolcall/`` and is resumable: finished steps are skipped.

    .venv/bin/python -m studies.study_toolcall --seeds 5 --workers 2 --figures docs/figures
    .venv/bin/python -m studies.study_toolcall --analyze-only
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path
from typing import Any

from studies import study  # the runner and the statistics

ROOT = study.ROOT
SETTING = "toolcall"
RL_CONFIG = ROOT / "studies" / "configs" / "study_toolcall.yaml"
SFT_CONFIG = ROOT / "studies" / "configs" / "sft_toolcall_study.yaml"
study.SETTINGS[SETTING] = RL_CONFIG  # also runs in the spawned workers, which import this module
ESTIMATORS = ["grpo", "corrgrpo", "dr_grpo", "gdpo", "mo_grpo", "gdpo_corr"]
EVAL_METRICS = ["all_exact_accuracy", "function_name", "parameter", "values", "format"]
#: Greedy decoding batch: the 202 eval tasks in 4 generate calls. Each batch slot is an env that
#: builds the data set (0.3 s each on a loaded CPU), so one call for all 202 costs more than it saves.
EVAL_BATCH = 51
#: The tiny model: Qwen2, hidden 128, 4 layers (about 1M parameters), 1024-entry BPE vocabulary.
MODEL_SIZE = {"vocab_size": 1024, "hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 4}
CHAT_TEMPLATE = (
    "{%- for message in messages -%}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
    "{% endfor -%}{%- if add_generation_prompt -%}<|im_start|>assistant\n{% endif -%}"
)


# ------------------------------------------------------------------------------ warm start
def _rl_config(overrides: list[str] | None = None) -> Any:
    from corrgrpo.trainer.config import load_config

    return load_config(RL_CONFIG, overrides or [])


def corpus(env_settings: Any, **overrides: Any) -> list[str]:
    """The tokenizer's corpus: every train-split task's prompt messages and reference answer, of
    the env settings ``env_settings`` (a config's ``env``) with ``overrides``."""
    import corrgrpo_envs

    env = corrgrpo_envs.make(env_settings, **{**overrides, "split": "train"}).unwrapped
    texts = []
    for task in env.tasks:
        texts += [m["content"] for m in task["messages"]]
        texts += env.reference_action(task.id)
    env.close()
    return texts


def build_init_model(path: Path, env: Any = None, **overrides: Any) -> Path:
    """Build (once) the random-init model and its tokenizer, trained on the corpus of ``env``
    (env settings; default: the study config's env), ``overrides`` over them, into ``path``."""
    from corrgrpo.agents.models import build_tiny_model

    if (path / "config.json").exists():
        return path
    model, tokenizer = build_tiny_model(seed=0, corpus=corpus(env or _rl_config().env, **overrides), **MODEL_SIZE)
    tokenizer.chat_template = CHAT_TEMPLATE
    tmp = path.with_name(path.name + ".tmp")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    os.replace(tmp, path)
    return path


def warm_start(out: Path, threads: int, overrides: list[str] | None = None) -> tuple[Path, float]:
    """The SFT warm start's model folder (trained once) and the seconds it took (0: cached)."""
    import torch

    from corrgrpo.trainer.sft import load_sft_config, sft

    model = out / "sft" / "model"
    if (model / "config.json").exists():
        return model, 0.0
    init = build_init_model(out / "init-model")
    cfg = load_sft_config(
        SFT_CONFIG,
        [f"model.name_or_path={init}", f"train.output_dir={out / 'sft'}", "train.progress=false",
         "train.tensorboard=false", *(overrides or [])],
    )
    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    sft(cfg)
    return model, time.perf_counter() - t0


# ------------------------------------------------------------------------------ evaluation
def _eval_one(job: tuple[str, str, int | None]) -> tuple[str, float]:
    """Greedy evaluation of one model folder on the EVAL split into ``eval.json``."""
    model, out_file, limit = job
    import warnings

    from corrgrpo.trainer.evaluate import evaluate

    warnings.filterwarnings("ignore")
    cfg = _rl_config([f"model.name_or_path={model}"])
    t0 = time.perf_counter()
    res = evaluate(cfg, split="eval", limit=limit, greedy=True, batch_size=EVAL_BATCH, progress=False)
    res["records"] = [{k: r[k] for k in ("task_id", "reward_components")} for r in res["records"]]
    Path(out_file).write_text(json.dumps(res, indent=1))
    return out_file, time.perf_counter() - t0


def final_model(run_dir: Path) -> Path:
    """The model of a run's last checkpoint."""
    ckpts = sorted(run_dir.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    if not ckpts:
        raise FileNotFoundError(f"no checkpoint in {run_dir}")
    return ckpts[-1] / "model"


def eval_all(out: Path, jobs: list[tuple[str, str, int | None]], workers: int) -> float:
    """Evaluate every model whose ``eval.json`` is missing; returns the wall seconds."""
    todo = [j for j in jobs if not Path(j[1]).exists()]
    print(f"{len(todo)} evaluations, {workers} at a time", flush=True)
    t0 = time.perf_counter()
    with mp.get_context("spawn").Pool(workers, initializer=study._worker_init) as pool:
        for i, (name, wall) in enumerate(pool.imap_unordered(_eval_one, todo), 1):
            print(f"[eval {i}/{len(todo)}] {name}: {wall:.1f} s", flush=True)
    return time.perf_counter() - t0


def analyze_eval(out: Path, estimators: list[str], seeds: list[int]) -> dict[str, Any]:
    """Eval metrics per estimator (mean, 95 % CI over seeds), paired differences to GRPO with
    Holm's correction over all these tests, and the warm start's numbers."""
    def metrics(path: Path) -> dict[str, float] | None:
        return json.loads(path.read_text())["metrics"] if path.exists() else None

    before = metrics(out / "sft" / "eval.json")
    runs = {(e, s): m for e in estimators for s in seeds
            if (m := metrics(study._run_dir(out, SETTING, e, s) / "eval.json")) is not None}
    result: dict[str, Any] = {"before": before, "estimators": {}}
    tests: dict[str, float] = {}
    for e in estimators:
        have = [s for s in seeds if (e, s) in runs]
        if not have:
            continue
        entry: dict[str, Any] = {"seeds": have, "after": {}, "vs_grpo": {}}
        for c in EVAL_METRICS:
            xs = [runs[(e, s)][c] for s in have]
            m, half = study._mean_ci(xs)
            entry["after"][c] = {"mean": m, "ci95": half, "values": xs}
            paired = [s for s in have if ("grpo", s) in runs]
            if e != "grpo" and len(paired) >= 2:
                d, dh, p = study._paired([runs[(e, s)][c] for s in paired], [runs[("grpo", s)][c] for s in paired])
                entry["vs_grpo"][c] = {"diff": d, "ci95": dh, "p": p, "n": len(paired)}
                if p == p:  # not nan
                    tests[f"{e}|{c}"] = p
        result["estimators"][e] = entry
    for key, p in study._holm(tests).items():
        e, c = key.split("|")
        result["estimators"][e]["vs_grpo"][c]["p_holm"] = p
    result["_num_tests"] = len(tests)
    return result


def eval_markdown(res: dict[str, Any]) -> str:
    """The evaluation tables as Markdown (metrics in percent)."""
    f = study._fmt
    head = "| estimator | " + " | ".join(EVAL_METRICS) + " |\n" + "|---" * (len(EVAL_METRICS) + 1) + "|"
    lines = ["### toolcall: greedy evaluation on the EVAL split (percent), 95 % CI over seeds", "", head]
    if res["before"]:
        lines.append("| (warm start) | " + " | ".join(f(res["before"][c], 1) for c in EVAL_METRICS) + " |")
    for e, entry in res["estimators"].items():
        a = entry["after"]
        lines.append(f"| {e} | " + " | ".join(f"{f(a[c]['mean'], 1)} ± {f(a[c]['ci95'], 1)}" for c in EVAL_METRICS) + " |")
    lines += ["", f"### toolcall: evaluation, paired difference to GRPO: mean [95 % CI], p (Holm over {res['_num_tests']} tests)", "", head]
    for e, entry in res["estimators"].items():
        v = entry["vs_grpo"]
        if v:
            lines.append(f"| {e} | " + " | ".join(
                f"{v[c]['diff']:+.1f} [±{f(v[c]['ci95'], 1)}], p={f(v[c]['p'], 3)} ({f(v[c].get('p_holm', float('nan')), 2)})"
                for c in EVAL_METRICS) + " |")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------ main
def _load() -> str:
    return " / ".join(f"{x:.1f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--estimators", default=",".join(ESTIMATORS))
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--workers", type=int, default=2, help="runs at a time (one torch thread each)")
    p.add_argument("--out", default=str(ROOT / "runs" / "study_toolcall"))
    p.add_argument("--steps", type=int, default=None, help="override train.steps (smoke tests)")
    p.add_argument("--sft-steps", type=int, default=None, help="override the warm start's train.steps (smoke tests)")
    p.add_argument("--eval-limit", type=int, default=None, help="evaluate on the first N eval tasks (default: all)")
    p.add_argument("--figures", default=None, help="folder for the PNG figure (default: the output folder)")
    p.add_argument("--analyze-only", action="store_true", help="do not train or evaluate; analyze what is there")
    args = p.parse_args(argv)

    estimators = [e.strip() for e in args.estimators.split(",") if e.strip()]
    if "grpo" not in estimators:
        raise ValueError("the estimators must include grpo (the paired baseline)")
    seeds = list(range(args.seeds))
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    walls: dict[str, Any] = {"load_start": _load()}
    meta_file = out / "walls.json"
    if meta_file.exists():  # keep the wall times of earlier (interrupted) invocations
        walls = json.loads(meta_file.read_text()) | {"load_start_resumed": _load()}
    model = out / "sft" / "model"
    if not args.analyze_only:
        t_total = time.perf_counter()
        sft_overrides = [f"train.steps={args.sft_steps}"] if args.sft_steps else []
        model, sft_s = warm_start(out, threads=1, overrides=sft_overrides)
        if sft_s:
            walls["sft_s"], walls["load_after_sft"] = sft_s, _load()
        print(f"warm start: {model} ({sft_s:.0f} s, load {_load()})", flush=True)
        rl_s = study.run_all(out, [SETTING], estimators, seeds, args.workers, args.steps,
                             overrides=[f"model.name_or_path={model}", "train.save_final=true"])
        walls.setdefault("rl_s", []).append(rl_s)
        walls["load_after_rl"] = _load()
        jobs = [(str(model), str(out / "sft" / "eval.json"), args.eval_limit)]
        jobs += [(str(final_model(d)), str(d / "eval.json"), args.eval_limit)
                 for s in seeds for e in estimators if (d := study._run_dir(out, SETTING, e, s)).exists()]
        walls.setdefault("eval_s", []).append(eval_all(out, jobs, args.workers))
        walls["load_end"] = _load()
        walls.setdefault("total_s", []).append(time.perf_counter() - t_total)
        meta_file.write_text(json.dumps(walls, indent=1))

    res = study.analyze(out, [SETTING], estimators, seeds)
    res["eval"] = analyze_eval(out, estimators, seeds)
    res["_meta"] = {"command": " ".join([sys.executable, *sys.argv]), "seeds": seeds, "workers": args.workers,
                    "walls": walls, "last_steps": study.LAST,
                    "configs": [str(RL_CONFIG.relative_to(ROOT)), str(SFT_CONFIG.relative_to(ROOT))]}
    (out / "results.json").write_text(json.dumps(res, indent=1))
    md = study.tables_markdown({SETTING: res[SETTING]} if SETTING in res else {}) + "\n" + eval_markdown(res["eval"])
    (out / "tables.md").write_text(md)
    print(md)
    study.draw_figures(out, SETTING, estimators, seeds, Path(args.figures) if args.figures else out,
                       name="study_toolcall")
    print(f"results: {out / 'results.json'}  tables: {out / 'tables.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
