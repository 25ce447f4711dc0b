"""Torch threads against a competing busy process: ``compute_advantages`` on 8192 x 7 rewards.

    python -m bench.threads                 # threads 1 and all cores, with and without a busy process
    python -m bench.threads --rounds 5 --calls 30

What the trainer's thread rule (``corrgrpo.trainer.threads.auto_torch_threads``) is for: OpenMP
threads that find a core taken spin against each other. Each measurement runs in a fresh
process with its torch thread count set explicitly (``torch.set_num_threads`` and
``OMP_NUM_THREADS``) and times ``--calls`` CorrGRPO calls on N = 8192 responses (1024
groups x 8, shuffled ids), K = 7, after 3 warm-up calls; the median is reported. The
busy process is a pure-Python spin loop (what a reward worker running a program looks
like to the scheduler). Configurations alternate round by round; the table shows the
median over rounds and each configuration's ratio to the 1-thread quiet one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.busy import BusyProcesses

ROOT = Path(__file__).resolve().parents[1]


def child(threads: int, calls: int, out: str) -> None:
    import torch

    if threads == 0:  # the trainer's automatic count, taken under whatever load runs now
        from corrgrpo.trainer.threads import auto_torch_threads

        threads = auto_torch_threads()
    torch.set_num_threads(threads)
    from corrgrpo.trainer.estimators import compute_advantages

    gen = torch.Generator().manual_seed(0)
    groups, size, k = 1024, 8, 7
    ids = torch.arange(groups).repeat_interleave(size)[torch.randperm(groups * size, generator=gen)]
    rewards = torch.rand(groups * size, k, generator=gen, dtype=torch.float64)
    times = []
    for i in range(calls + 3):
        start = time.perf_counter()
        compute_advantages(rewards, ids, estimator="corrgrpo")
        if i >= 3:
            times.append(time.perf_counter() - start)
    Path(out).write_text(json.dumps({"ms": statistics.median(times) * 1e3, "threads": torch.get_num_threads()}))


def _measure(threads: int, busy: int, calls: int) -> tuple[float, int]:
    """(median ms per call, torch threads used) with ``busy`` spinning processes alongside;
    ``threads`` 0 lets the child choose as the trainer does (``auto_torch_threads``)."""
    with BusyProcesses(busy, settle_s=0.2), tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
        if threads:  # 0: automatic, as a trainer started without OMP_NUM_THREADS chooses
            env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
        subprocess.run([sys.executable, "-m", "bench.threads", "--child", str(threads), "--calls", str(calls),
                        "--out", str(out)], check=True, env=env, cwd=ROOT, timeout=900)
        result = json.loads(out.read_text())
        return result["ms"], result["threads"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--busy", type=int, default=1, help="competing busy processes")
    parser.add_argument("--json", default=None, help="also write the results to this file")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    from bench.versions import format_versions, interpreter_versions  # bench/versions.py
    if not args.child:
        print(format_versions("versions", interpreter_versions()), flush=True)
    if args.child is not None:
        child(args.child, args.calls, args.out)
        return 0

    from corrgrpo.trainer.threads import auto_torch_threads, available_cores

    cores = available_cores()
    rule = auto_torch_threads(args.busy, "process")
    # 0 threads: the automatic count, chosen in the child with the busy processes running
    configs = [(1, 0), (cores, 0), (cores, args.busy), (rule, args.busy), (0, 0), (0, args.busy)]
    configs = list(dict.fromkeys(configs))
    load = os.getloadavg()[0]
    import torch

    print(f"compute_advantages(corrgrpo), N=8192, K=7; {cores} cores; rule for {args.busy} busy worker "
          f"process(es): {rule} thread(s); median of {args.calls} calls, {args.rounds} rounds; "
          f"load average {load:.1f}; torch {torch.__version__}", flush=True)
    results: dict[tuple[int, int], list[float]] = {c: [] for c in configs}
    chosen: dict[tuple[int, int], set[int]] = {c: set() for c in configs}
    for _ in range(args.rounds):
        for threads, busy in configs:
            ms, used = _measure(threads, busy, args.calls)
            results[(threads, busy)].append(ms)
            chosen[(threads, busy)].add(used)
    base = statistics.median(results[(1, 0)])
    print(f"{'torch threads':>13} {'busy procs':>10} {'ms/call':>9} {'vs 1 thread quiet':>18}  rounds")
    rows = []
    for (threads, busy), values in results.items():
        ms = statistics.median(values)
        label = f"{threads}" + (" (rule)" if (threads, busy) == (rule, args.busy) and busy else "")
        if threads == 0:
            label = "auto=" + "/".join(str(t) for t in sorted(chosen[(threads, busy)]))
        print(f"{label:>13} {busy:>10} {ms:9.2f} {ms / base:17.2f}x  {' '.join(f'{v:.1f}' for v in values)}")
        rows.append({"threads": threads or "automatic", "chosen": sorted(chosen[(threads, busy)]),
                     "busy": busy, "ms": ms, "rounds": values})
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "cores": cores, "rule": rule,
                                               "load_average": [load, os.getloadavg()[0]]}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
