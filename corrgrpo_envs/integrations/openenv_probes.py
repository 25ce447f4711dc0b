"""Red-team probes of the OpenEnv boundary: a served env under attack, and the client against
hostile servers (run by ``corrgrpo redteam``; each ``probe_<name>() -> (held, detail)``).

Server probes start ``python -m corrgrpo_envs.serve corrgrpo/ScaleDominance-v0`` on a free
loopback port and attack it for a few seconds while a legitimate client (OpenEnv's own
``GenericEnvClient`` over a WebSocket, as the trainer's client) times its round trips. An
attack is held when the server refuses it as designed, the legitimate client's p99 round
trip stays under :data:`P99_BOUND_S` with no error, the server's resident memory grows
by less than :data:`MEMORY_MB` and its log (stderr, at its default level) by less than
:data:`LOG_BYTES`: a server that writes a line per refused peer lets the attacker fill its
disk, or stall it on a full pipe.

Client probes start a small misbehaving server in this process (a raw socket server, or a
FastAPI app under uvicorn on a thread) and check that :class:`OpenEnvEnv` refuses it within
its deadline with one :class:`RemoteEnvError`, and never returns a non-finite or invented
reward. Every server is loopback only and stopped when its probe ends.

The probes live by family: over HTTP (:mod:`~corrgrpo_envs.integrations.openenv_http_probes`),
over WebSockets (:mod:`~corrgrpo_envs.integrations.openenv_websocket_probes`) and against the
client (:mod:`~corrgrpo_envs.integrations.openenv_client_probes`), on what they share
(:mod:`~corrgrpo_envs.integrations.openenv_probe_harness`). ``corrgrpo redteam`` registers every
``probe_*`` of this module.
"""

from __future__ import annotations

from corrgrpo_envs.integrations.openenv_client_probes import (
    probe_openenv_client_huge_observation,
    probe_openenv_client_lying_rewards,
    probe_openenv_client_trickle,
)
from corrgrpo_envs.integrations.openenv_http_probes import (
    probe_openenv_server_oversize_body,
    probe_openenv_server_reference_answers,
    probe_openenv_server_request_flood,
    probe_openenv_server_session_flood,
    probe_openenv_server_token,
)
from corrgrpo_envs.integrations.openenv_probe_harness import MEMORY_MB, P99_BOUND_S
from corrgrpo_envs.integrations.openenv_websocket_probes import (
    probe_openenv_server_connection_churn,
    probe_openenv_server_websocket_squatters,
)

__all__ = [
    "P99_BOUND_S",
    "MEMORY_MB",
    "probe_openenv_client_huge_observation",
    "probe_openenv_client_lying_rewards",
    "probe_openenv_client_trickle",
    "probe_openenv_server_connection_churn",
    "probe_openenv_server_oversize_body",
    "probe_openenv_server_reference_answers",
    "probe_openenv_server_request_flood",
    "probe_openenv_server_session_flood",
    "probe_openenv_server_token",
    "probe_openenv_server_websocket_squatters",
]
