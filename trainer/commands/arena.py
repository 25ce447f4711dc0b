"""``corrgrpo arena CONFIG|FOLDER ... --estimators ... --seeds N --parallel P``: every estimator x
seed on the same regimes, and one report (tables, paired tests, tiers, a Pareto plot, costs)."""

from __future__ import annotations

import argparse
import shlex
import sys

EXAMPLE = "corrgrpo arena arena --seeds 5 --parallel 2        # the five shipped regimes, every estimator"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = (
        f"example:\n  {EXAMPLE}\n  corrgrpo arena arena/scale.yaml --estimators grpo,corrgrpo,gdpo --seeds 3\n"
        "  corrgrpo arena my_toolcall.yaml --eval greedy --eval-set bfcl limit=100 env.dataset=data/bfcl \\\n"
        "      rollout.max_new_tokens=256          # also held out on BFCL: eval-bfcl.json in each run\n\n"
        "past one machine:\n"
        "  corrgrpo arena arena --seeds 5 --out runs/arena --commands > runs.txt   # one line per run\n"
        "  (run each line as a Slurm array task or a job of your own; each trains exactly one run)\n"
        "  corrgrpo arena arena --seeds 5 --out runs/arena --report              # merge the run folders"
    )
    parser.add_argument("items", nargs="+", metavar="CONFIG",
                        help="regime configs or folders of them (a path, or a name in env_configs/, e.g. "
                             "'arena' for the five shipped regimes), then optional KEY=VALUE settings "
                             "applied to every run")
    parser.set_defaults(overrides=[])
    parser.add_argument("--estimators", default=None,
                        help="comma-separated estimator names (default: every registered one); grpo, the "
                             "paired baseline, is always included")
    parser.add_argument("--seeds", type=int, default=5, help="seeds 0..N-1 per regime and estimator (default 5)")
    parser.add_argument("--parallel", type=int, default=1, help="runs at once, each its own process (default 1)")
    parser.add_argument("--out", default="runs/arena", help="the arena folder (default runs/arena)")
    parser.add_argument("--eval-limit", type=int, default=64,
                        help="evaluate each final model on the first N held-out tasks (default 64; 0: all)")
    parser.add_argument("--eval", choices=["sample", "greedy"], default="sample",
                        help="held-out evaluation: sample at the config's temperature, as in training "
                             "(default; the toy regimes' greedy answers are degenerate), or greedy")
    parser.add_argument("--eval-set", action="append", nargs="+", default=[], dest="eval_sets",
                        metavar=("NAME", "SETTING"),
                        help="also evaluate each final model on the extra held-out set NAME, given by "
                             "SETTINGs: split=SPLIT (default eval), limit=N (default --eval-limit; 0: all) "
                             "and KEY=VALUE config settings of that evaluation, applied after the run's "
                             "(e.g. env.dataset=PATH rollout.max_new_tokens=256); each run writes "
                             "eval-NAME.json and the report gets a table per set; repeat for more sets. "
                             "A set's settings run to the next option: put the settings of every run "
                             "before it")
    parser.add_argument("--no-eval-start", action="store_false", dest="eval_start",
                        help="do not evaluate the starting model (default: it is evaluated on every set, "
                             "as <regime>/start/, and the report gives each estimator's change from it)")
    parser.add_argument("--keep-checkpoints", action="store_true",
                        help="keep each run's model once evaluated (default: removed, the arena keeps its logs)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--commands", action="store_true",
                      help="print one command per unfinished run (for a scheduler) and exit")
    mode.add_argument("--only", metavar="LABEL", default=None,
                      help="train and evaluate only the run LABEL (REGIME/ESTIMATOR/sSEED), as --commands prints")
    mode.add_argument("--report", action="store_true", help="do not train: write the report from the finished runs")


def _split(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    items = [*args.items, *args.overrides]
    return [i for i in items if "=" not in i], [i for i in items if "=" in i]


def run(args: argparse.Namespace) -> int:
    import subprocess

    from corrgrpo.trainer.arena import (
        eval_set_words,
        parse_eval_set,
        plan_arena,
        run_arena,
        scheduler_commands,
    )
    from corrgrpo.trainer.arena_report import write_report
    from corrgrpo.trainer.config import ConfigError
    from corrgrpo.trainer.run_queue import ModelRemoved, RunFailed

    if args.seeds < 1 or args.parallel < 1 or args.eval_limit < 0:
        print("error: --seeds and --parallel must be >= 1, --eval-limit >= 0")
        return 2
    configs, overrides = _split(args)
    if not configs:
        print("error: give at least one regime config or folder (e.g. 'arena')")
        return 2
    estimators = [e.strip() for e in args.estimators.split(",") if e.strip()] if args.estimators else None
    try:
        eval_sets = [parse_eval_set(words, args.eval_limit or None) for words in args.eval_sets]
        plan = plan_arena(configs, overrides, estimators, args.seeds, args.out,
                          eval_limit=args.eval_limit or None, keep_checkpoints=args.keep_checkpoints,
                          eval_sample=args.eval == "sample", eval_sets=eval_sets, eval_start=args.eval_start)
    except (ConfigError, FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}")
        return 2
    prefix = ["corrgrpo", "arena", *configs, *overrides, "--estimators", ",".join(plan.estimators),
              "--seeds", str(args.seeds), "--out", str(plan.out), "--eval-limit", str(args.eval_limit), "--eval", args.eval]
    if not args.eval_start:
        prefix.append("--no-eval-start")
    for eval_set in plan.eval_sets:
        prefix += ["--eval-set", *eval_set_words(eval_set)]
    if args.commands:
        lines = scheduler_commands(plan, prefix)
        print("\n".join(lines))
        print(f"# {len(lines)} runs; then: {shlex.join([*prefix, '--report'])}", file=sys.stderr)
        return 0
    wall, failure = None, None
    if not args.report:
        try:
            done = run_arena(plan, args.parallel, only=args.only)
            wall = done["wall_seconds"]
        except (ValueError, ModelRemoved) as exc:
            print(f"error: {exc}")
            return 2
        except subprocess.CalledProcessError as exc:
            print(f"error: the run failed ({exc}); see run.log in its folder; run the same command again to resume")
            return 1
        except RunFailed as exc:  # the report still shows every run that finished
            failure = f"error: {exc}; run the same command again to resume"
        if args.only:
            print(f"{args.only}: {done['runs_done']}")
            return 0
    result = write_report(plan, shlex.join(["corrgrpo", "arena", *sys.argv[2:]]), wall)
    for regime, entry in result["regimes"].items():
        ranked = sorted(entry["estimators"].items(), key=lambda kv: (kv[1]["tier"], -kv[1]["score"]["mean"]))
        print(f"{regime}: " + ", ".join(f"{e} {r['score']['mean']:.1f} (tier {r['tier']})" for e, r in ranked))
    print(f"report: {plan.out / 'report.md'}  results: {plan.out / 'results.json'}  plot: {plan.out / 'pareto.png'}")
    if failure:
        print(failure)
        return 1
    return 0
