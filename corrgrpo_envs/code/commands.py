"""``corrgrpo code``: utilities of the code domain.

* ``corrgrpo code precompute-references --dataset humaneval``: measure and
  cache every reference runtime (the ``efficiency`` reward's baseline), with a
  progress bar; already cached references are skipped.
* ``corrgrpo code sandboxes``: which sandbox backends work on this machine.
* ``corrgrpo code redteam [--backend B]``: ``corrgrpo redteam``, every known attack class
  (sandbox, judge, paste, OpenEnv) against this machine, ``held`` or ``BROKEN`` each
  (exit status 1 when one is broken).
"""

from __future__ import annotations

import argparse

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="code_command", metavar="ACTION", required=True)
    pre = sub.add_parser("precompute-references", help="measure and cache reference runtimes")
    pre.add_argument("--dataset", default="humaneval", help="humaneval or a JSONL(.gz) path")
    pre.add_argument("--format", default=None, help="force a file format (leetcode, jsonl)")
    pre.add_argument("--split", default="all", choices=["train", "eval", "all"])
    pre.add_argument("--backend", default="auto", help="auto, process, bwrap or docker")
    pre.add_argument("--workers", type=int, default=None, help="parallel programs (default: CPUs)")
    pre.add_argument("--runs", type=int, default=3, help="runs averaged per reference")
    pre.add_argument("--timeout", type=float, default=5.0, help="seconds per program")
    pre.add_argument("--cache-dir", default=None, help="cache root (default $CORRGRPO_CODE_REFS or ~/.cache)")
    pre.add_argument("--limit", type=int, default=None, help="only the first N tasks")
    sub.add_parser("sandboxes", help="which sandbox backends work here")
    red = sub.add_parser("redteam", help="run every known attack against this machine's sandbox")
    red.add_argument("--backend", default="auto", help="auto, process, bwrap or docker")
    red.add_argument("--only", nargs="+", default=None, metavar="NAME", help="these attack classes")
    red.add_argument("--list", action="store_true", help="list the attack classes and exit")


def run(args: argparse.Namespace) -> int:
    if args.code_command == "redteam":
        return _redteam(args)
    if args.code_command == "sandboxes":
        from corrgrpo_sandbox import available_backends
        from corrgrpo_sandbox.hostuser import host_is_root

        report = available_backends()
        for name, reason in report.items():
            print(f"{name:8s} {'ok' if not reason else 'unavailable: ' + reason}")
        chosen = "bwrap" if not report["bwrap"] else "process"
        why = "" if chosen == "bwrap" else f" (bwrap: {report['bwrap']})"
        print(f"auto     -> {chosen}{why}")
        print("programs run as " + ("a fresh unprivileged host uid per sandbox (host is root)"
                                    if host_is_root() else "this user, inside a user namespace"))
        from corrgrpo_sandbox.cgroups import cgroup_unavailable_reason

        groups = cgroup_unavailable_reason()
        print("per-sandbox memory and process caps: " + (
            "a control group per sandbox" if not groups else
            f"RLIMIT_NPROC x RLIMIT_AS per uid (no control group: {groups})"))
        from corrgrpo_sandbox.cgroups import cpu_accounting, cpu_unavailable_reason

        accounting = cpu_accounting()
        print("CPU time of a program (efficiency): " + (
            f"its control group ({accounting})" if accounting else
            f"unavailable, efficiency is not scored ({cpu_unavailable_reason()})"))
        from corrgrpo_sandbox.seccomp import (
            DENIED,
            DENIED_FLAGS,
            DENIED_VALUES,
            seccomp_unavailable_reason,
        )

        reason = seccomp_unavailable_reason()
        some = len(DENIED_VALUES) + len(DENIED_FLAGS)
        print("seccomp filter: " + (f"{len(DENIED)} system calls denied, {some} more for some "
                                    "arguments (docs/code.md)" if not reason
                                    else f"none, programs may make every system call ({reason})"))
        return 0
    return _precompute(args)


def _redteam(args: argparse.Namespace) -> int:
    """``corrgrpo code redteam`` is ``corrgrpo redteam``: every domain's attack classes."""
    from corrgrpo_envs.redteam.command import run

    return run(args)


def _precompute(args: argparse.Namespace) -> int:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    from corrgrpo_envs.code.env import CodeEnv
    from corrgrpo_sandbox import SandboxPool

    env = CodeEnv(dataset=args.dataset, format=args.format, split=args.split, backend=args.backend,
                  timeout=args.timeout, reference_runs=args.runs, reference_cache_dir=args.cache_dir)
    refs = env.references
    tasks = list(env.tasks)[: args.limit] if args.limit else list(env.tasks)
    failed: list[str] = []
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeRemainingColumn()) as progress:
        bar = progress.add_task(f"{env.tasks.name} references", total=len(tasks))

        def measure(task):
            program = env.reference_program(task)
            if refs.seconds(program, task.id, env.limits) is None:
                failed.append(task.id)
            progress.advance(bar)

        with SandboxPool(env.sandbox, args.workers) as pool:
            pool.map(measure, tasks)
    print(f"cached {len(tasks) - len(failed)} reference times in {refs.folder} "
          f"(backend {env.sandbox.name})")
    if failed:
        print(f"{len(failed)} references failed their own tests (efficiency stays 0 there): "
              + ", ".join(failed[:10]) + (" ..." if len(failed) > 10 else ""))
    return 0
