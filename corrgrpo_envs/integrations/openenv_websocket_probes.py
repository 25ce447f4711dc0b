"""Red-team probes of a served env over WebSockets: squatters holding session slots with cheap
``state`` messages, and connections opened and closed in a loop. Each
``probe_<name>() -> (held, detail)``; see :mod:`~corrgrpo_envs.integrations.openenv_probes`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter

from corrgrpo_envs.integrations.openenv_probe_harness import (
    ATTACK_S,
    _closed_as,
    _hammer,
    _served,
    _under_attack,
    _verdict,
    _ws_url,
)

#: Where the WebSocket squatters and churners connect from: another loopback address than the
#: legitimate client's (127.0.0.1), as another machine would (Linux answers all of 127/8).
ATTACKER_ADDRESS = "127.0.0.2"
#: Sockets the squatter opens, and the seconds between the ``state`` messages that hold them.
SQUATTERS = 64
SQUAT_EVERY_S = 3.0
#: The squatted server's sessions (its quota per client is half of them).
SQUATTED_SESSIONS = 16


def _newcomer(base: str) -> str:
    """A client that arrives while the attack goes on: opens a session and plays one episode."""
    from openenv.core import GenericEnvClient

    try:
        with GenericEnvClient(base_url=base, message_timeout_s=30.0).sync() as env:
            env.reset()
            env.step({"message": "0.5"})
    except Exception as exc:  # noqa: BLE001 - what it got instead is the outcome
        return f"newcomer refused ({str(exc)[:120]})"
    return "newcomer played"


def probe_openenv_server_websocket_squatters() -> tuple[bool, str]:
    """OpenEnv server: 64 WebSockets holding slots with state messages get their quota; others play"""
    from websockets.asyncio.client import connect

    with _served("--max-sessions", str(SQUATTED_SESSIONS)) as server:
        base = server.base
        quota = SQUATTED_SESSIONS // 2
        held = [0, 0]  # now, most at once

        async def attack() -> Counter[str]:
            counts: Counter[str] = Counter()
            answered = asyncio.Semaphore(0)
            stop = asyncio.Event()

            async def squatter() -> None:
                first = True
                while not stop.is_set():
                    holding = False
                    try:
                        async with connect(_ws_url(base), open_timeout=30, compression=None,
                                           local_addr=(ATTACKER_ADDRESS, 0)) as ws:
                            while not stop.is_set():
                                await ws.send(json.dumps({"type": "state"}))
                                reply = json.loads(await asyncio.wait_for(ws.recv(), 30))
                                if reply.get("type") != "state":
                                    counts[f"refused {reply.get('data', {}).get('code')}"] += 1
                                    break
                                if not holding:
                                    holding = True
                                    held[0] += 1
                                    held[1] = max(held)
                                    counts["held a session"] += 1
                                if first:
                                    first = False
                                    answered.release()
                                with contextlib.suppress(TimeoutError):
                                    await asyncio.wait_for(stop.wait(), SQUAT_EVERY_S)
                    except Exception as exc:  # noqa: BLE001 - a refusal or a close is an outcome too
                        counts[_closed_as(exc)] += 1
                    finally:
                        held[0] -= holding
                    if first:
                        first = False
                        answered.release()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), 1.0)

            tasks = [asyncio.create_task(squatter()) for _ in range(SQUATTERS)]
            for _ in range(SQUATTERS):  # every squatter holds a slot or was refused one
                await answered.acquire()
            counts[await asyncio.to_thread(_newcomer, base)] += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), ATTACK_S)
            stop.set()
            await asyncio.gather(*tasks)
            return counts

        outcome = _under_attack(server, attack)
        refused = (held[1] <= quota and outcome.counts["newcomer played"] == 1
                   and sum(n for k, n in outcome.counts.items() if k.startswith(("refused", "closed 1013"))) > 0)
        what = (f"{SQUATTERS} squatters from {ATTACKER_ADDRESS} held at most {held[1]} sessions at once "
                f"(quota {quota} of {SQUATTED_SESSIONS}), a newcomer from another address "
                + ("played" if outcome.counts["newcomer played"] else "was refused"))
        return _verdict(refused, what, outcome)


def probe_openenv_server_connection_churn() -> tuple[bool, str]:
    """OpenEnv server: opening and closing WebSockets in a loop is rate-limited (close code 1013)"""
    from websockets.asyncio.client import connect

    with _served() as server:
        base = server.base

        async def attack() -> Counter[str]:
            async def one(i: int) -> str:
                async with connect(_ws_url(base), open_timeout=30, compression=None,
                                   local_addr=(ATTACKER_ADDRESS, 0)) as ws:
                    if i % 4:
                        return "opened and closed"
                    try:
                        await ws.send(json.dumps({"type": "reset", "data": {}}))
                        reply = json.loads(await asyncio.wait_for(ws.recv(), 30))
                    except Exception as exc:  # noqa: BLE001 - refused before the reset went out
                        return f"reset: {_closed_as(exc)}"
                    if reply.get("type") == "error":
                        return f"reset refused {reply.get('data', {}).get('code')}"
                    return "reset answered"
            return await _hammer(ATTACK_S, 16, one)

        outcome = _under_attack(server, attack)
        limited = outcome.counts["reset: closed 1013"]
        refused = limited > 0 and outcome.counts["reset answered"] > 0
        return _verdict(refused, f"{sum(outcome.counts.values())} connections from {ATTACKER_ADDRESS} in "
                        f"{ATTACK_S:g} s, {limited} of the resets refused for the rate", outcome)

