"""The ``corrgrpo`` console command.

Each sub-command lives in its own module, imported only when it runs, so that
``corrgrpo envs list`` does not pay for torch and ``corrgrpo advantages`` does
not pay for AgentDojo. A module provides ``add_arguments(parser)`` and
``run(args) -> int``.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import sys
import traceback

#: sub-command name -> (module path, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "advantages": ("corrgrpo.trainer.commands.advantages", "advantage estimators: demo and inspection"),
    "envs": ("corrgrpo_envs.commands", "list registered environments, check one against the contract"),
    "serve": ("corrgrpo_envs.serve", "serve an env as an OpenEnv server (extra: openenv)"),
    "train": ("corrgrpo.trainer.commands.train", "train a policy from a YAML config"),
    "sft": ("corrgrpo.trainer.commands.sft", "supervised fine-tuning (a warm start for train) from a YAML config"),
    "eval": ("corrgrpo.trainer.commands.evaluate", "evaluate a policy on a domain's metrics"),
    "plot": ("corrgrpo.trainer.commands.plot", "plot one or more training runs"),
    "advise": ("corrgrpo.trainer.commands.advise", "known conditions in runs' diagnostics and what to try"),
    "sweep": ("corrgrpo.trainer.commands.sweep", "a grid of reward weightings x seeds x estimators, and its Pareto front"),
    "arena": ("corrgrpo.trainer.commands.arena", "every estimator x seed on the same regimes: tables, paired tests, tiers, costs"),
    "redteam": ("corrgrpo_envs.redteam.command", "every known attack (sandbox, judge, paste, OpenEnv) against this machine"),
    "code": ("corrgrpo_envs.code.commands", "code domain utilities (reference runtimes)"),
}


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, object]]:
    """Build the top-level parser; sub-command modules are imported lazily."""
    parser = argparse.ArgumentParser(
        prog="corrgrpo",
        description="Multi-reward RL for language-model agents (CorrGRPO).",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules: dict[str, object] = {}
    argv = sys.argv[1:]
    wanted = next((a for a in argv if not a.startswith("-")), None)
    for name, (module_path, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == wanted:
            module = importlib.import_module(module_path)
            module.add_arguments(p)  # type: ignore[attr-defined]
            modules[name] = module
    return parser, modules


def parse_intermixed(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """``argv`` parsed, with ``KEY=VALUE`` overrides allowed after the options too.

    argparse gives a ``nargs="*"`` positional only the words before the first option, so
    ``corrgrpo eval run.yaml --limit 5 rollout.max_new_tokens=64`` would be refused; its
    trailing overrides are taken here, in order, after the ones given before the options.
    (``parse_intermixed_args`` does this, but not under subcommands.)
    """
    args, rest = parser.parse_known_args(argv)
    later = [a for a in rest if "=" in a and not a.startswith("-")]
    unknown = [a for a in rest if a not in later]
    if later and isinstance(getattr(args, "overrides", None), list):
        args.overrides = [*args.overrides, *later]
    elif later:
        unknown = rest
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    return args


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``corrgrpo`` command."""
    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    # Entry points (``env.id: mypkg.envs:PoliteEnv``) resolve against the working directory,
    # as under ``python -m``: a console script's sys.path[0] is its bin folder instead.
    # transformers' per-load "Loading weights" / "Writing model shards" bars would interleave
    # with the command's own progress line (set HF_HUB_DISABLE_PROGRESS_BARS=0 to see them)
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    parser, modules = build_parser()
    args = parse_intermixed(parser, sys.argv[1:])
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return int(modules[args.command].run(args) or 0)  # type: ignore[attr-defined]
    except BaseException as error:
        # the failed command's frames would keep its model (a DDP reducer) alive past the group
        traceback.clear_frames(error.__traceback__)
        raise
    finally:
        close_process_group()


def close_process_group() -> None:
    """Destroy the torch.distributed process group a launched run set up, if any.

    Left to the interpreter's exit, gloo's worker threads can be torn down while still joinable,
    and the process then aborts ("terminate called without an active exception") after its work
    is done, failing the whole launch.

    Call it once the run's objects are released. The group must go last: if a DDP reducer
    outlives it, the reducer drops the group's final reference while holding the GIL, and gloo's
    destructor joins a worker thread that is waiting for the GIL to free a finished collective's
    tensors; the process then hangs for ever (one launch in ten here). Collecting first frees
    what reference cycles still hold, so the group's own (GIL-releasing) destructor runs last.
    """
    torch = sys.modules.get("torch")  # a command that never imported torch has no group
    if torch is not None and torch.distributed.is_available() and torch.distributed.is_initialized():
        gc.collect()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    raise SystemExit(main())
