"""``corrgrpo serve ENV``: serve a multi-reward env over OpenEnv (HTTP + WebSocket).

ENV is a registered id, an entry point ``package.module:attribute`` or an env YAML;
``key=value`` arguments after it are the env's keyword arguments (a value that reads as
JSON is that number, boolean, list or object; anything else is a string).
The server is the ``openenv`` package's own (extra ``openenv``), run by uvicorn, with the
limits of :mod:`corrgrpo_envs.integrations.openenv_limits` (token, body cap, idle and old
sessions, sessions and new connections per client, env builds at once, reference answers off
unless ``--serve-references``).
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

__all__ = ["add_arguments", "run", "parse_env_arguments", "main"]


def parse_env_arguments(items: list[str]) -> dict[str, Any]:
    """``["split=eval", "num_tasks=8", "efficiency=off"]`` -> ``{"split": "eval", "num_tasks": 8, "efficiency": "off"}``."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"env argument {item!r} is not key=value")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value  # YAML would read "off" as False; a plain string stays a string
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("env", help="env id, package.module:attribute, or an env YAML")
    parser.add_argument("env_args", nargs="*", help="env keyword arguments, e.g. split=eval dataset=humaneval")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0 for other machines)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--workers", type=int, default=1, help="uvicorn worker processes")
    parser.add_argument("--max-sessions", type=int, default=128, help="concurrent sessions per worker")
    parser.add_argument(
        "--token", action="append", default=None,
        help="token: every path but /health then needs 'Authorization: Bearer TOKEN'; give it once per "
        "client to count each client's sessions and connections by its token rather than its address "
        "(default: the CORRGRPO_OPENENV_TOKEN environment variable; none when unset)",
    )
    parser.add_argument(
        "--serve-references", action="store_true",
        help="let clients read the env's reference answers (/{name}/task; corrgrpo sft needs it)",
    )
    parser.add_argument(
        "--session-idle-s", type=float, default=600.0,
        help="close a WebSocket session whose client neither resets nor steps for this many seconds "
        "(state requests do not count)",
    )
    parser.add_argument(
        "--session-detached-s", type=float, default=60.0,
        help="close a session with no WebSocket (made over HTTP /mcp, or whose WebSocket closed) "
        "this many seconds after its last request; at a full server, a WebSocket session between "
        "episodes that has been quiet this long gives its slot to a new client",
    )
    parser.add_argument(
        "--session-max-age-s", type=float, default=3600.0,
        help="close a WebSocket session older than this between episodes (mid-episode, "
        "--session-idle-s later); OpenEnv's client opens a new one on its next call",
    )
    parser.add_argument(
        "--sessions-per-client", type=int, default=None,
        help="sessions one client (an address, or a token) may hold at once "
        "(default: half of --max-sessions)",
    )
    parser.add_argument(
        "--connections-per-s", type=float, default=5.0,
        help="new WebSocket connections a client may open each second, after a burst of "
        "--sessions-per-client; beyond it a connection is refused (close code 1013)",
    )
    parser.add_argument(
        "--concurrent-builds", type=int, default=1,
        help="session envs built at once (each on its session's first reset, never on connect)",
    )
    parser.add_argument("--log-level", default="warning")


def run(args: argparse.Namespace) -> int:
    try:
        kwargs = parse_env_arguments(args.env_args)
    except ValueError as exc:
        print(f"error: {exc}")
        return 2
    kwargs.setdefault("split", "all")
    try:
        from corrgrpo_envs.integrations.openenv_limits import (
            TOKEN_VARIABLE,
            ServerLimits,
            is_loopback,
        )
        from corrgrpo_envs.integrations.openenv_server import EnvBuildError, serve
    except ImportError as exc:
        print(
            f"error: corrgrpo serve needs the openenv extra ({exc.name or exc} is missing): "
            "pip install -e '.[openenv]' && pip install --no-deps openenv==0.10.0"
        )
        return 2
    if args.token is not None and not all(args.token):
        print("error: --token is empty")
        return 2
    from_variable = os.environ.get(TOKEN_VARIABLE, "")
    tokens = tuple(args.token) if args.token is not None else ((from_variable,) if from_variable else ())
    try:
        limits = ServerLimits(
            tokens=tokens,
            session_idle_s=args.session_idle_s,
            detached_s=args.session_detached_s,
            session_max_age_s=args.session_max_age_s,
            sessions_per_client=args.sessions_per_client,
            connections_per_s=args.connections_per_s,
            concurrent_builds=args.concurrent_builds,
            serve_references=args.serve_references,
        )
    except ValueError as exc:
        print(f"error: {exc}")
        return 2
    if not limits.tokens and not is_loopback(args.host):
        print(
            f"warning: serving on {args.host} without a token: anyone who can reach port {args.port} "
            f"can open sessions and use the env; pass --token or set {TOKEN_VARIABLE}",
            flush=True,
        )
    notes = [n for n, on in (("token required", limits.tokens), ("references served", limits.serve_references)) if on]

    def announce() -> None:
        extra = f"; {', '.join(notes)}" if notes else ""
        print(f"serving {args.env} {kwargs} over OpenEnv on http://{args.host}:{args.port} (ws /ws){extra}",
              flush=True)

    try:
        serve(
            args.env,
            kwargs,
            host=args.host,
            port=args.port,
            workers=args.workers,
            max_sessions=args.max_sessions,
            log_level=args.log_level,
            limits=limits,
            on_ready=announce,
        )
    except EnvBuildError as exc:
        print(f"error: {exc}")
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m corrgrpo_envs.serve ENV ...``: the same command without the trainer (no torch)."""
    parser = argparse.ArgumentParser(prog="python -m corrgrpo_envs.serve", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
