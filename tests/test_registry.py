"""Tests of corrgrpo_registry: one registry for estimators, losses, rollout engines and env ids."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from corrgrpo_registry import Registry, is_entry_point, load_entry_point, parse_entry_point

ROOT = Path(__file__).resolve().parents[1]


def _double(x):
    return 2 * x


def test_register_get_names_and_the_error_listing_known_names():
    reg: Registry = Registry("widget")
    reg.register("b", _double)

    @reg.register("a", colour="red")
    def half(x):
        return x / 2

    assert reg.names() == ["a", "b"] and list(reg) == ["a", "b"] and len(reg) == 2
    assert reg.get("a") is half and reg.get("b")(3) == 6 and "a" in reg
    assert reg.metadata("a") == {"colour": "red"} and reg.metadata("zzz") == {}
    with pytest.raises(ValueError, match=r"unknown widget 'c'; available: a, b \(or an entry point"):
        reg.get("c")
    no_entry_points: Registry = Registry("widget", entry_points=False)
    with pytest.raises(ValueError, match=r"^unknown widget 'x:y'; available: $"):
        no_entry_points.get("x:y")


def test_a_taken_name_needs_override():
    reg: Registry = Registry("widget")
    reg.register("a", _double, colour="red")
    with pytest.raises(ValueError, match="a widget named 'a' is already registered.*override=True"):
        reg.register("a", abs)
    assert reg.get("a") is _double
    reg.register("a", abs, override=True)
    assert reg.get("a") is abs and reg.metadata("a") == {}  # metadata goes with the object


def test_names_with_a_colon_are_refused():
    with pytest.raises(ValueError, match="cannot contain ':'"):
        Registry("widget").register("pkg:fn", _double)


def test_entry_point_fallback_and_its_errors():
    reg: Registry = Registry("widget")
    assert reg.get("os.path:join") is os.path.join and reg.get("json:JSONDecoder.decode")
    with pytest.raises(ValueError, match="widget entry point 'no_such_mod_qq:f': cannot import 'no_such_mod_qq'"):
        reg.get("no_such_mod_qq:f")
    with pytest.raises(ValueError, match="module 'os' has no attribute 'nope'"):
        reg.get("os:nope")
    with pytest.raises(ValueError, match="is not callable"):
        reg.get("os:sep")
    with pytest.raises(ValueError, match="must look like 'package.module:attribute'"):
        reg.get("os:")


def test_lazy_registration_imports_on_first_use():
    reg: Registry = Registry("widget")
    reg.register("lazy", "os.path:join")
    assert reg.get("lazy") is os.path.join and reg.get("lazy") is os.path.join
    reg.register("broken", "no_such_mod_qq:f")  # registering imports nothing
    with pytest.raises(ValueError, match="cannot import 'no_such_mod_qq'"):
        reg.get("broken")
    with pytest.raises(ValueError, match="must look like"):
        reg.register("bad", "not an entry point")


def test_snapshot_and_unregister():
    reg: Registry = Registry("widget")
    reg.register("a", _double)
    restore = reg.snapshot()
    reg.register("b", abs)
    reg.unregister("a")
    assert reg.names() == ["b"]
    restore()
    assert reg.names() == ["a"]


def test_entry_point_parsing():
    assert parse_entry_point("a.b:c.d") == ("a.b", "c.d")
    assert is_entry_point("pkg.mod:Class") and not is_entry_point("corrgrpo/Code-v0")
    assert not is_entry_point("a:") and not is_entry_point("my-pkg:x")
    with pytest.raises(AttributeError, match="module 'os' has no attribute 'nope'"):
        load_entry_point("os:nope")
    with pytest.raises(ModuleNotFoundError):
        load_entry_point("no_such_mod_qq:f")


def test_every_kind_uses_it():
    import corrgrpo_envs
    from corrgrpo_envs.registry import ENVS
    from trainer.advantages import ESTIMATORS
    from trainer.engines import ENGINES
    from trainer.losses import LOSSES

    assert {"grpo", "corrgrpo"} <= set(ESTIMATORS.names())
    assert LOSSES.names() == ["cispo", "dapo", "dr_grpo", "grpo", "gspo"]
    assert ENGINES.names() == ["hf", "server", "vllm"]
    assert "corrgrpo/ScaleDominance-v0" in ENVS and ENVS.names() == corrgrpo_envs.registered_ids()
    assert "toy" in ENVS.metadata("corrgrpo/ScaleDominance-v0")["description"]


def test_env_ids_still_go_through_gymnasium():
    import gymnasium as gym

    import corrgrpo_envs  # noqa: F401 (registers the built-in domains)

    env = gym.make("corrgrpo/ScaleDominance-v0")
    assert env.unwrapped.reward_names
    env.close()


def test_the_server_engine_registers_without_being_imported():
    """engines.py no longer imports server_engine.py (an import circle) to register it."""
    code = textwrap.dedent("""
        import sys
        from trainer.engines import ENGINES, RolloutEngine
        assert "server" in ENGINES.names()
        assert "trainer.server_engine" not in sys.modules
        cls = ENGINES.get("server")
        assert cls.__name__ == "ServerEngine" and issubclass(cls, RolloutEngine)
    """)
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True,
                   env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


def test_a_rollout_backend_may_be_an_entry_point():
    from trainer.config import ConfigError, load_config

    cfg = load_config(ROOT / "env_configs" / "quickstart.yaml", ["rollout.backend=trainer.engines:HFEngine"])
    assert cfg.rollout.backend == "trainer.engines:HFEngine"
    with pytest.raises(ConfigError, match="rollout.backend: rollout backend entry point 'no_such_mod_qq:E'"):
        load_config(ROOT / "env_configs" / "quickstart.yaml", ["rollout.backend=no_such_mod_qq:E"])
