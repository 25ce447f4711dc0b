"""Tests of corrgrpo_registry: one registry for estimators, losses, rollout engines and env ids."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from corrgrpo_registry import Registry, is_entry_point, load_entry_point, parse_entry_point
from tests.user_env_source import USER_ENV

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
    from corrgrpo.trainer.engines import ENGINES
    from corrgrpo.trainer.estimators import ESTIMATORS
    from corrgrpo.trainer.losses import LOSSES
    from corrgrpo_envs.registry import ENVS

    assert {"grpo", "corrgrpo"} <= set(ESTIMATORS.names())
    assert LOSSES.names() == ["cispo", "dapo", "dr_grpo", "grpo", "gspo", "sft"]
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
        from corrgrpo.trainer.engines import ENGINES, RolloutEngine
        assert "server" in ENGINES.names()
        assert "corrgrpo.trainer.server_engine" not in sys.modules
        cls = ENGINES.get("server")
        assert cls.__name__ == "ServerEngine" and issubclass(cls, RolloutEngine)
    """)
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True,
                   env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


def test_a_rollout_backend_may_be_an_entry_point():
    from corrgrpo.trainer.config import ConfigError, load_config

    cfg = load_config(ROOT / "env_configs" / "quickstart.yaml", ["rollout.backend=corrgrpo.trainer.engines:HFEngine"])
    assert cfg.rollout.backend == "corrgrpo.trainer.engines:HFEngine"
    with pytest.raises(ConfigError, match="rollout.backend: rollout backend entry point 'no_such_mod_qq:E'"):
        load_config(ROOT / "env_configs" / "quickstart.yaml", ["rollout.backend=no_such_mod_qq:E"])


# ------------------------------------------------------------------ env ids: one resolver
@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "resolver_user_env.py").write_text(USER_ENV)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "resolver_user_env"
    sys.modules.pop("resolver_user_env", None)


def test_a_registered_id_resolves_without_importing_its_module():
    from corrgrpo_envs.registry import resolve

    r = resolve("corrgrpo/ScaleDominance-v0")
    assert (r.kind, r.id, r.entry_point) == ("registered", "corrgrpo/ScaleDominance-v0",
                                             "corrgrpo_envs.toy.env:ScaleDominanceEnv")
    assert r.urls == () and r.section is None and r.path is None and r.target is None
    assert r.factory().__name__ == "ScaleDominanceEnv"
    env = r.make(num_tasks=3)
    assert env.spec.id == "corrgrpo/ScaleDominance-v0" and len(env.unwrapped.task_ids) == 3


def test_an_entry_point_resolves_to_its_class_and_its_parameters(user_module):
    from corrgrpo_envs.registry import resolve

    r = resolve(f"{user_module}:UserEnv")
    assert r.kind == "entry_point" and r.factory().__name__ == "UserEnv" and r.settings_class() is None
    assert r.accepts("max_turns") and r.accepts("n") and not r.accepts("nope")
    env = r.make(n=5, max_turns=2)  # no settings class: keyword arguments go through as they are
    assert env.spec.id == f"{user_module}:UserEnv" and len(env.unwrapped.task_ids) == 5
    assert env.unwrapped.max_turns == 2


def test_a_yaml_file_resolves_to_the_env_its_section_names(tmp_path, user_module):
    from corrgrpo_envs.registry import resolve

    path = tmp_path / "user.yaml"
    path.write_text(f"env:\n  id: {user_module}:UserEnv\n  n: 4\n")
    r = resolve(str(path))
    assert (r.kind, r.id, r.path) == ("yaml", f"{user_module}:UserEnv", path)
    assert r.section == {"id": f"{user_module}:UserEnv", "n": 4} and dict(r.kwargs) == {"n": 4}
    assert r.target is not None and r.target.kind == "entry_point" and r.accepts("max_turns")
    assert len(r.make().unwrapped.task_ids) == 4
    assert len(r.make(n=2).unwrapped.task_ids) == 2  # overrides win over the file
    from corrgrpo.trainer.config import resolve_config_path

    # the env registry reads an explicit YAML path; finding a shipped config by name is the trainer's
    shipped = resolve(resolve_config_path("scale_dominance.yaml"))
    assert shipped.kind == "yaml" and shipped.target.kind == "registered"
    with pytest.raises(FileNotFoundError, match="scale_dominance.yaml"):
        resolve("scale_dominance.yaml")


def test_openenv_servers_resolve_to_their_urls_without_a_connection():
    from corrgrpo_envs.registry import resolve

    r = resolve("openenv://127.0.0.1:1,openenv://127.0.0.1:2")
    assert r.kind == "openenv" and r.urls == ("http://127.0.0.1:1", "http://127.0.0.1:2")
    assert dict(r.kwargs) == {"url": "openenv://127.0.0.1:1,openenv://127.0.0.1:2"}
    assert r.factory().__name__ == "OpenEnvEnv" and r.accepts("max_turns")
    listed = resolve(["openenv://127.0.0.1:1", "openenv://127.0.0.1:2"])
    assert listed.id == r.id and listed.urls == r.urls


@pytest.mark.parametrize("given, error, says", [
    ("corrgrpo/Nope-v0", ValueError, r"unknown env id 'corrgrpo/Nope-v0'; registered: .*corrgrpo/ToolCall-v0"),
    ("not an id", ValueError, r"or give an entry point 'package.module:attribute'"),
    ("no_such_module_qq:Env", ModuleNotFoundError, "no_such_module_qq"),
    ("resolver_user_env:Nope", AttributeError, r"module 'resolver_user_env' has no attribute 'Nope'"),
    ("resolver_user_env:NOT_CALLABLE", TypeError, r"is not a class or a factory: 3"),
    ("nowhere-config.yaml", FileNotFoundError, r"config 'nowhere-config.yaml' not found"),
    (["corrgrpo/ToolCall-v0"], ValueError, r"a list must hold openenv://HOST:PORT addresses"),
    ([], ValueError, r"a list must hold openenv://HOST:PORT addresses"),
    ("openenv://", ValueError, r"not an OpenEnv server address: 'openenv://'"),
    ("openenv://a:1,ftp://b:2", ValueError, r"not an OpenEnv server address"),
])
def test_each_bad_id_is_one_error_naming_it(given, error, says, user_module):
    from corrgrpo_envs.registry import check_id, resolve

    with pytest.raises(error, match=says):
        resolve(given)
    with pytest.raises((ValueError, FileNotFoundError)) as info:  # check_id: one line for a command
        check_id(given)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("text, says", [
    ("env:\n  n: 4\n", r"bad.yaml: needs an 'env:' section with an 'id' key"),
    ("- a\n- b\n", r"bad.yaml: expected a mapping at the top level"),
    ("env:\n  id: other.yaml\n", r"bad.yaml: env.id must be an env id or an entry point, not a config"),
    ("env:\n  id: 3\n", r"bad.yaml: env.id must be an env id, an entry point or openenv://HOST:PORT"),
    ("env:\n  id: corrgrpo/Nope-v0\n", r"bad.yaml: env.id: unknown env id 'corrgrpo/Nope-v0'"),
    ("env:\n  id: a\n  id: b\n", r"bad.yaml:3: duplicate key 'id' \(first set on line 2\)"),
    ("env:\n  id: [unclosed\n", r"bad.yaml:3: not valid YAML"),
    ("env:\n  id: corrgrpo/ScaleDominance-v0\n  import: [no_such_module_qq]\n",
     r"bad.yaml: env.import: cannot import 'no_such_module_qq'"),
])
def test_a_bad_yaml_file_is_a_config_error_naming_the_file(tmp_path, text, says):
    from corrgrpo_envs.registry import resolve
    from corrgrpo_registry.settings import ConfigError

    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=says):
        resolve(str(path))


def test_an_oversized_or_binary_yaml_file_is_refused_before_parsing(tmp_path):
    from corrgrpo_envs.registry import resolve
    from corrgrpo_registry.settings import ConfigError
    from corrgrpo_registry.yaml_files import MAX_YAML_BYTES

    big = tmp_path / "big.yaml"
    big.write_text("#" * (MAX_YAML_BYTES + 1))
    with pytest.raises(ConfigError, match=r"big.yaml: larger than 128 KiB"):
        resolve(str(big))
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"env:\n  id: \xff\xfe\n")
    with pytest.raises(ConfigError, match=r"bin.yaml:2: not UTF-8 text"):
        resolve(str(binary))


def test_no_other_module_reads_env_ids():
    """Env ids are read by the resolver alone: no other module parses ``openenv://`` or reads
    Gymnasium's registry (the OpenEnv client parses the addresses it is given)."""
    import re

    pattern = re.compile(r"""startswith\(\s*["']openenv://|gym\.registry|gym\.spec\(|gymnasium\.registry""")
    offenders = [
        str(path.relative_to(ROOT))
        for package in ("corrgrpo_envs", "trainer", "agents", "corrgrpo_registry")
        for path in (ROOT / package).rglob("*.py")
        if path.name != "registry.py" and pattern.search(path.read_text())
    ]
    assert offenders == []


def test_the_openenv_scheme_is_written_once_in_the_library():
    """``openenv://`` is one constant (``corrgrpo_envs.integrations.OPENENV_SCHEME``): every other
    module names it, so the registry and the client cannot read env ids differently."""
    import ast

    found = []
    for package in ("corrgrpo_envs", "corrgrpo_registry", "corrgrpo_sandbox", "trainer", "agents"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Constant) and node.value == "openenv://":
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == ["corrgrpo_envs/integrations/__init__.py:13"]
    from corrgrpo_envs.integrations import OPENENV_SCHEME
    from corrgrpo_envs.registry import OPENENV_SCHEME as in_registry

    assert in_registry is OPENENV_SCHEME


def test_one_import_line_serves_a_trl_user_without_trl_imported():
    """``CorrGRPOTrainer`` and the env adapter ``for_trl`` come from one module, which imports
    without TRL (the trainer class is built on first access)."""
    code = ("import sys; from corrgrpo.trainer.integrations import trl as m; "
            "from corrgrpo_envs.integrations.trl import TRLSetup, for_trl; "
            "assert m.for_trl is for_trl and m.TRLSetup is TRLSetup; "
            "assert {'for_trl', 'TRLSetup', 'CorrGRPOTrainer'} <= set(m.__all__); "
            "assert 'trl' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
