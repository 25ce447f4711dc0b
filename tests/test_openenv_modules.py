"""The OpenEnv modules split by concern keep their old import paths: the client, the served env's
limits and the red-team probes are still imported from the modules users know, as the same
objects, and each side logs under one name."""

from __future__ import annotations

import importlib

import pytest

pytest.importorskip("openenv", reason="the openenv extra is not installed (pip install -e '.[openenv]')")

PACKAGE = "corrgrpo_envs.integrations"
#: Where each public name of the three entry modules is defined now.
HOMES = {
    "openenv_client": {
        "OpenEnvEnv": "openenv_client", "RemoteEnvError": "openenv_remote", "RemoteRewardError": "openenv_remote",
        "RemoteReferenceError": "openenv_remote", "parse_urls": "openenv_remote", "auth_headers": "openenv_remote",
        "mcp_tool_call": "openenv_schema", "SCHEME": "openenv_remote", "TOKEN_ENV": "openenv_remote",
        "FLOAT32_MAX": "openenv_schema", "PROBE_TEXT": "openenv_discovery",
        "DEFAULT_MAX_OBSERVATION_BYTES": "openenv_settings",
    },
    "openenv_limits": {
        "TOKEN_VARIABLE": "openenv_quotas", "ServerLimits": "openenv_quotas", "is_loopback": "openenv_quotas",
        "AGE_QUIET_S": "openenv_quotas", "BoundaryMiddleware": "openenv_middleware",
        "LimitedEnvServer": "openenv_sessions", "WebSocketConnection": "openenv_sessions",
    },
    "openenv_probes": {
        "P99_BOUND_S": "openenv_probe_harness", "MEMORY_MB": "openenv_probe_harness",
        "probe_openenv_server_token": "openenv_http_probes",
        "probe_openenv_server_connection_churn": "openenv_websocket_probes",
        "probe_openenv_client_lying_rewards": "openenv_client_probes",
    },
}


def _module(name: str):
    return importlib.import_module(f"{PACKAGE}.{name}")


@pytest.mark.parametrize("entry", sorted(HOMES))
def test_public_names_are_imported_from_where_they_were(entry):
    module = _module(entry)
    for name in module.__all__:
        assert hasattr(module, name), f"{entry}.__all__ names {name}, which it lacks"
    for name, home in HOMES[entry].items():
        assert getattr(module, name) is getattr(_module(home), name), f"{entry}.{name} is not {home}.{name}"


def test_the_probes_module_offers_every_probe_of_its_families():
    probes = _module("openenv_probes")
    families = ("openenv_http_probes", "openenv_websocket_probes", "openenv_client_probes")
    defined = {n for f in families for n in vars(_module(f)) if n.startswith("probe_")}
    assert len(defined) == 10 and defined == {n for n in vars(probes) if n.startswith("probe_")}


def test_each_side_logs_under_the_name_of_its_entry_module():
    client = ("openenv_remote", "openenv_discovery", "openenv_failover")
    assert {_module(m).log.name for m in client} == {f"{PACKAGE}.openenv_client"}
    server = ("openenv_quotas", "openenv_middleware", "openenv_sessions")
    assert {_module(m).log.name for m in server} == {f"{PACKAGE}.openenv_limits"}
