"""Envs over OpenEnv against in-process: one server, two servers, side by side in one run.

For each env (the code env on HumanEval with the reference answers, G=8; the toy env), a
``GroupedVectorEnv`` of P groups x G members plays ``--rounds`` rounds of reset + step:

* ``in-process``: the members live in this process (``--threads`` threads; the baseline);
* ``1 server``: ``corrgrpo serve`` free to use every core, the members its sessions
  (the overhead of serving, against in-process);
* ``1 server, core 0``: the same pinned to one core (``taskset``; the code sandbox's
  processes inherit the pin);
* ``2 servers, cores 0+1``: two ``corrgrpo serve``, each pinned to its own core; the groups
  spread over them (the scaling, against ``1 server, core 0``).

Reported: member steps per second (reset + step of every member, over the rounds; best of
``--repeats``, modes interleaved so they share the machine's load) and the latency a remote
step adds: one member, reset + step in sequence, remote mean minus in-process mean. Beside
each rate, the CPU time it cost per member step: the whole machine's (``/proc/stat``: the
client, the servers, the sandboxes' programs), the client process's own, the server
processes' own (not their sandboxes'), and how many of the cores were busy. Where the cores are all busy, the rates follow the machine's CPU per step, so
the gap between in-process and a server is the CPU that serving adds. Run it on an otherwise
quiet machine: every process's CPU counts. The code env's ``efficiency`` reward is off on
every side (it would time each reference). The load average at the start and end of the run is
printed with the results.

    python -m bench.remote_env --rounds 5 --repeats 2
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import corrgrpo_envs
from bench.versions import format_versions, interpreter_versions
from corrgrpo_envs.vector import GroupedVectorEnv
from tests.openenv_servers import corrgrpo_serve

ROOT = Path(__file__).resolve().parents[1]

ENVS = {
    "code": ("corrgrpo/Code-v0", {"dataset": "humaneval", "efficiency": "off"}),
    "toy": ("corrgrpo/ScaleDominance-v0", {}),
}


def _pinned(server, core: int):
    if shutil.which("taskset") and (os.cpu_count() or 1) > core:
        server.argv = ["taskset", "-c", str(core), *server.argv]
    return server


@dataclass(frozen=True)
class Throughput:
    """Member steps per second over some rounds, and the CPU time they cost."""

    steps_per_s: float
    machine_cpu_ms: float  # every process's CPU time per member step
    client_cpu_ms: float  # this process's CPU time per member step
    server_cpu_ms: float  # the server processes' own CPU time per member step (not their children's)
    cores_busy: float  # the machine's CPU time over the wall time


def _machine_busy_s() -> float:
    """Seconds of CPU time every core spent busy since boot (``/proc/stat``'s first line)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")  # guest time is in user already


def _processes_cpu_s(pids: tuple[int, ...]) -> float:
    """Seconds of CPU time the processes ``pids`` spent themselves (``utime`` + ``stime``)."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # fields 14 and 15 of proc(5)
    return total / os.sysconf("SC_CLK_TCK")


def _own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def rounds_per_second(spec, kwargs: dict, groups: int, group_size: int, rounds: int, threads: int,
                      references: dict[str, str], task_ids: list[str],
                      server_pids: tuple[int, ...] = ()) -> Throughput:
    """Member steps (reset + step) per second over ``rounds`` rounds, with their CPU time
    (``server_pids``: the server processes the members talk to)."""
    with GroupedVectorEnv(spec, num_groups=groups, group_size=group_size, workers=threads,
                          split="all", **kwargs) as venv:
        venv.reset(task_ids=task_ids[:groups])  # connections, sandboxes and caches warm
        venv.step([references[t] for t in task_ids[:groups] for _ in range(group_size)])
        start, machine, own = time.perf_counter(), _machine_busy_s(), _own_cpu_s()
        served = _processes_cpu_s(server_pids)
        for r in range(rounds):
            tasks = [task_ids[(r * groups + p) % len(task_ids)] for p in range(groups)]
            venv.reset(task_ids=tasks)
            _, rewards, *_ = venv.step([references[t] for t in tasks for _ in range(group_size)])
        elapsed = time.perf_counter() - start
        machine, own = _machine_busy_s() - machine, _own_cpu_s() - own
        served = _processes_cpu_s(server_pids) - served
    steps = rounds * groups * group_size
    return Throughput(steps / elapsed, 1e3 * machine / steps, 1e3 * own / steps, 1e3 * served / steps,
                      machine / elapsed)


def step_latency(spec, kwargs: dict, references: dict[str, str], task_ids: list[str], n: int) -> float:
    """Mean seconds of one member's reset + step, in sequence."""
    env = corrgrpo_envs.make(spec, split="all", **kwargs)
    try:
        env.reset(options={"task_id": task_ids[0]})
        env.step(references[task_ids[0]])
        start = time.perf_counter()
        for i in range(n):
            t = task_ids[i % len(task_ids)]
            env.reset(options={"task_id": t})
            env.step(references[t])
        return (time.perf_counter() - start) / n
    finally:
        env.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--envs", nargs="+", default=list(ENVS), choices=list(ENVS))
    ap.add_argument("--groups", type=int, default=4, help="P tasks per round")
    ap.add_argument("--group-size", type=int, default=8, help="G rollouts per task")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--latency-steps", type=int, default=40)
    ap.add_argument("--threads", type=int, default=8, help="client threads (and in-process workers)")
    args = ap.parse_args()
    print(f"load average at start: {os.getloadavg()}")
    print(format_versions("corrgrpo", interpreter_versions()))
    import importlib.metadata as md

    print("openenv " + ", ".join(f"{p} {md.version(p)}" for p in ("openenv", "fastapi", "uvicorn", "websockets")))
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"remote_env_bench_{os.getpid()}"
    tmp.mkdir(parents=True, exist_ok=True)
    for name in args.envs:
        env_id, kwargs = ENVS[name]
        probe = corrgrpo_envs.make(env_id, split="all", **kwargs).unwrapped
        task_ids = list(probe.task_ids)
        references = {t: probe.reference_action(t)[0] for t in task_ids}
        probe.close()
        serve_args = [f"{k}={v}" for k, v in {"split": "all", **kwargs}.items()]
        servers = [_pinned(corrgrpo_serve(env_id, *serve_args, tmp=tmp), core) for core in (0, 1)]
        servers.append(corrgrpo_serve(env_id, *serve_args, tmp=tmp))  # unpinned
        for s in servers:
            s.launch()
        try:
            for s in servers:
                s.start()
            pids = [s.proc.pid for s in servers]  # taskset execs the server: the same pid
            modes = {
                "in-process": (env_id, kwargs, ()),
                "1 server": (servers[2].url, {}, (pids[2],)),
                "1 server, core 0": (servers[0].url, {}, (pids[0],)),
                "2 servers, cores 0+1": (f"{servers[0].url},{servers[1].url}", {}, (pids[0], pids[1])),
            }
            best = {m: Throughput(0.0, 0.0, 0.0, 0.0, 0.0) for m in modes}
            for _ in range(args.repeats):
                for mode, (spec, kw, server_pids) in modes.items():
                    measured = rounds_per_second(spec, kw, args.groups, args.group_size,
                                                 args.rounds, args.threads, references, task_ids,
                                                 server_pids)
                    if measured.steps_per_s > best[mode].steps_per_s:
                        best[mode] = measured
            lat_local = step_latency(env_id, kwargs, references, task_ids, args.latency_steps)
            lat_remote = step_latency(servers[2].url, {}, references, task_ids, args.latency_steps)
        finally:
            for s in servers:
                s.stop()
        print(f"\n{name}: {env_id} {kwargs}, P={args.groups} x G={args.group_size}, "
              f"{args.rounds} rounds, best of {args.repeats}, {args.threads} client threads")
        print("| | member steps/s | vs in-process | vs 1 server, core 0 "
              "| CPU ms per member step: machine (client, servers) | cores busy |")
        print("|---|---|---|---|---|---|")
        base, pinned = best["in-process"].steps_per_s, best["1 server, core 0"].steps_per_s
        for mode, m in best.items():
            print(f"| {mode} | {m.steps_per_s:,.1f} | {m.steps_per_s / base:.2f} | "
                  f"{m.steps_per_s / pinned:.2f} | {m.machine_cpu_ms:.2f} ({m.client_cpu_ms:.2f}, "
                  f"{m.server_cpu_ms:.2f}) "
                  f"| {m.cores_busy:.2f} of {os.cpu_count()} |")
        print(f"latency of one reset + step: in-process {lat_local * 1e3:.2f} ms, "
              f"1 server {lat_remote * 1e3:.2f} ms, added {(lat_remote - lat_local) * 1e3:.2f} ms")
    print(f"\nload average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
