"""Each built-in env declares its keyword arguments as settings: checked on ``make`` and in a
run config's ``env:`` section with the errors of every other key, listed by ``--help``."""

from __future__ import annotations

import dataclasses
import inspect
import re
import typing
from pathlib import Path

import pytest

import corrgrpo_envs
from corrgrpo_envs.registry import resolve
from corrgrpo_envs.settings import EnvSettings
from corrgrpo_registry.settings import ConfigError
from tests.user_env_source import USER_ENV

DOMAINS = {
    "corrgrpo/ScaleDominance-v0": "toy",
    "corrgrpo/ToolCall-v0": "toolcall",
    "corrgrpo/Code-v0": "code",
    "corrgrpo/AgentDojo-v0": "agentdojo",
}
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("env_id", sorted({**DOMAINS, "corrgrpo/Regime-v0": "toy"}))
def test_the_constructor_takes_exactly_the_settings_fields(env_id):
    """Each setting is declared once, in the settings class: the constructor takes a settings
    object or keyword arguments, and reads them through the class (no parameter list of its own)."""
    resolved = resolve(env_id)
    settings, factory = resolved.settings_class(), resolved.factory()
    module = f"corrgrpo_envs.{DOMAINS.get(env_id, 'toy')}.settings"
    assert settings.__module__ == module and issubclass(settings, EnvSettings)
    assert resolved.settings == f"{module}:{settings.__name__}"
    params = inspect.signature(factory).parameters
    assert [(p.name, p.kind) for p in params.values()] == [
        ("settings", inspect.Parameter.POSITIONAL_OR_KEYWORD), ("kwargs", inspect.Parameter.VAR_KEYWORD)]
    assert typing.get_type_hints(factory.__init__)["settings"] == settings | None
    # every field is accepted under its own name, any other name is refused before anything is built
    fields = {f.name for f in dataclasses.fields(settings)}
    assert {"max_action_chars", "render_mode", "split"} <= fields
    with pytest.raises(ConfigError, match=r"^unknown key 'no_such_setting'; allowed keys: ") as info:
        factory(no_such_setting=1)
    assert set(str(info.value).split("allowed keys: ")[1].split(", ")) == fields


def test_the_env_reads_a_settings_object_or_its_fields_alike():
    from corrgrpo_envs.toy.env import ScaleDominanceEnv
    from corrgrpo_envs.toy.settings import ToySettings

    by_object = ScaleDominanceEnv(ToySettings(num_tasks=3, letter="b"))
    by_keywords = ScaleDominanceEnv(num_tasks=3, letter="b")
    over = ScaleDominanceEnv(ToySettings(num_tasks=3, letter="b"), num_tasks=2)
    assert by_object.task_ids == by_keywords.task_ids and len(over.task_ids) == 2
    assert by_object.reward_names == by_keywords.reward_names
    with pytest.raises(TypeError, match="ToySettings"):
        ScaleDominanceEnv(object())


def test_the_openenv_constructor_takes_exactly_the_settings_fields():
    """The OpenEnv client declares no setting of its own either: its first argument is the
    servers (the resolver and most callers give them by position) or the settings object, and
    everything else is read through the settings class."""
    from corrgrpo_envs.integrations.openenv_client import OpenEnvEnv
    from corrgrpo_envs.integrations.openenv_settings import OpenEnvSettings

    resolved = resolve("openenv://127.0.0.1:8000,openenv://127.0.0.1:8001")
    assert resolved.settings_class() is OpenEnvSettings and resolved.factory() is OpenEnvEnv
    assert issubclass(OpenEnvSettings, EnvSettings)
    params = inspect.signature(OpenEnvEnv).parameters
    assert [(p.name, p.kind) for p in params.values()] == [
        ("url", inspect.Parameter.POSITIONAL_OR_KEYWORD), ("kwargs", inspect.Parameter.VAR_KEYWORD)]
    assert OpenEnvSettings in typing.get_args(typing.get_type_hints(OpenEnvEnv.__init__)["url"])
    fields = {f.name for f in dataclasses.fields(OpenEnvSettings)}
    assert {"url", "max_action_chars", "render_mode", "split", "timeout_s"} <= fields
    # any other name is refused before a server is asked anything
    with pytest.raises(ConfigError, match=r"^unknown key 'no_such_setting'; allowed keys: ") as info:
        OpenEnvEnv("openenv://127.0.0.1:9", no_such_setting=1)
    assert set(str(info.value).split("allowed keys: ")[1].split(", ")) == fields
    # the ranges and the action format are the settings' own, by keyword or in a settings object
    with pytest.raises(ConfigError, match=r"^timeout_s: -1.0 is out of range; allowed: > 0$"):
        OpenEnvEnv("openenv://127.0.0.1:9", timeout_s=-1)
    with pytest.raises(ConfigError, match=r"^action_format: 'xml' is not allowed; allowed values: "
                                          r"one of 'text', 'mcp'$"):
        OpenEnvEnv(OpenEnvSettings(url="openenv://127.0.0.1:9", action_format="xml"))
    with pytest.raises(ConfigError, match=r"^max_observation_bytes: 10 is out of range; allowed: >= 1024$"):
        OpenEnvEnv(OpenEnvSettings(url="openenv://127.0.0.1:9"), max_observation_bytes=10)
    with pytest.raises(ConfigError, match=r"^url: expected string or list, got 3$"):
        OpenEnvEnv(3)
    with pytest.raises(ConfigError, match=r"env.timeout_s: -1.0 is out of range; allowed: > 0"):
        resolved.build_settings({**resolved.kwargs, "timeout_s": -1}, "env")
    with pytest.raises(ConfigError, match=r"unknown key 'env.timeout'"):
        resolved.build_settings({**resolved.kwargs, "timeout": 3}, "env")


def test_every_domain_folder_has_the_same_shape():
    for domain in DOMAINS.values():
        assert (ROOT / "corrgrpo_envs" / domain / "settings.py").is_file(), domain
        assert (ROOT / "corrgrpo_envs" / domain / "env.py").is_file(), domain


@pytest.mark.parametrize("kwargs, says", [
    ({"letterz": "b"}, r"^corrgrpo/ScaleDominance-v0: unknown key 'letterz'; allowed keys: dataset, "),
    ({"num_tasks": "4"}, r"^corrgrpo/ScaleDominance-v0: num_tasks: expected an integer, got '4'$"),
    ({"num_tasks": 0}, r"^corrgrpo/ScaleDominance-v0: num_tasks: 0 is out of range; allowed: >= 1$"),
    ({"rewards": "nope"}, r"rewards: 'nope' is not allowed; allowed values: one of 'default', 'anchor'"),
    ({"scales": [1.0, 2.0]}, r"scales: \[1.0, 2.0\] has 2 entries; allowed: exactly 3"),
    ({"split": "test"}, r"split: 'test' is not allowed; allowed values: one of 'train', 'eval', 'all'"),
])
def test_make_checks_the_keyword_arguments_against_the_settings(kwargs, says):
    with pytest.raises(ConfigError, match=says):
        corrgrpo_envs.make("corrgrpo/ScaleDominance-v0", **kwargs)


def test_make_still_takes_python_objects_and_coerces_numbers():
    from corrgrpo_envs.tasks import Task, TaskSource

    source = TaskSource([Task("t0", {"prompt": "hi"}), Task("t1", {"prompt": "ho"})], name="two")
    env = corrgrpo_envs.make("corrgrpo/ScaleDominance-v0", dataset=source, scales=(1, 2, 3))
    assert env.unwrapped.task_ids == ["t0", "t1"] and env.unwrapped.scales.tolist() == [1.0, 2.0, 3.0]
    tool = corrgrpo_envs.make("corrgrpo/ToolCall-v0", num_tasks=4, seed=1, rules="strict")
    assert len(tool.unwrapped.task_ids) == 4 and tool.unwrapped.rules == "strict"
    with pytest.raises(ConfigError, match=r"corrgrpo/Code-v0: timeout: -1.0 is out of range; allowed: > 0"):
        corrgrpo_envs.make("corrgrpo/Code-v0", timeout=-1)


def test_a_yaml_file_is_checked_against_the_settings_of_the_env_it_names(tmp_path):
    path = tmp_path / "toy.yaml"
    path.write_text("env:\n  id: corrgrpo/ScaleDominance-v0\n  max_digitz: 3\n")
    with pytest.raises(ConfigError, match=r"corrgrpo/ScaleDominance-v0: unknown key 'max_digitz'"):
        corrgrpo_envs.make(str(path))


def _train_config(tmp_path, env_lines: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text("env:\n" + env_lines + "train:\n  steps: 1\n")
    return path


@pytest.mark.parametrize("env_lines, says", [
    ("  id: corrgrpo/AgentDojo-v0\n  max_turns_x: 3\n",
     r"run.yaml:3: unknown key 'env.max_turns_x'; allowed keys: attacks, benchmark_version, "),
    ("  id: corrgrpo/ToolCall-v0\n  num_tasks: -1\n",
     r"run.yaml:3: env.num_tasks: -1 is out of range; allowed: >= 1$"),
    ("  id: corrgrpo/ToolCall-v0\n  rules: lax\n",
     r"run.yaml:3: env.rules: 'lax' is not allowed; allowed values: one of 'paper', 'strict'$"),
    ("  id: corrgrpo/Code-v0\n  memory_mb: lots\n",
     r"run.yaml:3: env.memory_mb: expected an integer, got 'lots'$"),
    ("  id: corrgrpo/AgentDojo-v0\n  max_turns: 3\n",
     r"run.yaml:3: env.max_turns: this setting belongs in rollout.max_turns; set it there$"),
    ("  id: corrgrpo/Nope-v0\n",
     r"run.yaml:2: env.id: unknown env id 'corrgrpo/Nope-v0'; registered: "),
])
def test_a_run_configs_env_keys_are_checked_like_every_other_key(tmp_path, env_lines, says):
    from corrgrpo.trainer.config import load_config

    path = _train_config(tmp_path, env_lines)
    with pytest.raises(ConfigError, match=says) as info:
        load_config(path)
    assert "\n" not in str(info.value)
    assert "split" not in str(info.value).split("allowed keys:")[-1].split(", ")  # the trainer's


def test_the_trainer_gives_max_turns_to_envs_that_take_it(tmp_path):
    from corrgrpo.trainer.config import config_from_dict
    from corrgrpo.trainer.setup import env_kwargs

    dojo = config_from_dict({"env": {"id": "corrgrpo/AgentDojo-v0"}, "rollout": {"max_turns": 4}})
    assert env_kwargs(dojo)["max_turns"] == 4
    toy = config_from_dict({"env": {"id": "corrgrpo/ScaleDominance-v0", "num_tasks": 3},
                            "rollout": {"max_turns": 4}})
    assert env_kwargs(toy) == {**toy.env.kwargs(), "num_tasks": 3, "split": "train"}
    assert "max_turns" not in env_kwargs(toy)


def test_an_env_without_settings_gets_its_keyword_arguments_as_before(tmp_path, monkeypatch):
    from corrgrpo.trainer.config import config_from_dict
    from corrgrpo.trainer.setup import env_kwargs

    (tmp_path / "untyped_env_mod.py").write_text(USER_ENV)
    monkeypatch.syspath_prepend(str(tmp_path))
    restore = corrgrpo_envs.registry.ENVS.snapshot()
    try:
        corrgrpo_envs.register("user/Untyped-v0", "untyped_env_mod:UserEnv")
        assert resolve("user/Untyped-v0").settings_class() is None
        assert len(corrgrpo_envs.make("user/Untyped-v0", n=3).unwrapped.task_ids) == 3
        with pytest.raises(TypeError, match="anything"):  # the constructor's own error, as before
            corrgrpo_envs.make("user/Untyped-v0", anything=1)
        cfg = config_from_dict({"env": {"id": "user/Untyped-v0", "n": 3, "anything": 1},
                                "rollout": {"max_turns": 2}})  # not checked: no settings
        assert env_kwargs(cfg) == {"n": 3, "anything": 1, "split": "train", "max_turns": 2}
        assert type(cfg.env).__name__ == "EnvOptions" and cfg.env.id == "user/Untyped-v0"
    finally:
        restore()
        import gymnasium as gym

        gym.registry.pop("user/Untyped-v0", None)


def test_the_your_env_page_example_runs(capsys):
    page = (ROOT / "docs" / "getting-started" / "your-env.md").read_text(encoding="utf-8")
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", page, flags=re.DOTALL) if "GreetSettings" in b]
    restore = corrgrpo_envs.registry.ENVS.snapshot()
    try:
        exec(compile(block, "your-env.md", "exec", dont_inherit=True), {"__name__": "your_env_example"})
    finally:
        restore()
        import gymnasium as gym

        gym.registry.pop("myorg/Greet-v0", None)
    assert capsys.readouterr().out.strip() == (
        "myorg/Greet-v0: num_names: 7 is out of range; allowed: >= 1 and <= 3")


@pytest.mark.parametrize("command", ["train", "sft"])
def test_help_lists_every_env_setting_but_the_trainers(command, capsys):
    from corrgrpo.trainer.cli import main

    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = capsys.readouterr().out
    env_part = text.split("env settings, by env.id", 1)[1]
    for env_id in DOMAINS:
        assert f"  {env_id}:\n" in env_part
    assert "    env.num_tasks  (integer; allowed: >= 1)  [64]" in env_part
    assert "    env.rules  (one of 'paper', 'strict')  [\"paper\"]" in env_part
    assert "env.split  (" not in env_part and "env.max_turns  (" not in env_part  # the command's own
    assert ("env.reward_weights  (" in env_part) == (command == "sft")  # train: algorithm.reward_weights
