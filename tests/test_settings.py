"""One configuration system for train and sft: shared section types, one validator, errors that
say where the value came from, and --help generated from the same types."""

from __future__ import annotations

import dataclasses
import re
import typing
from pathlib import Path

import pytest

from corrgrpo.trainer.config import (
    MOVED_KEYS,
    Config,
    ConfigError,
    ModelConfig,
    OptimizerConfig,
    RunConfig,
    load_config,
)
from corrgrpo.trainer.sft import SFTConfig, load_sft_config
from corrgrpo_registry.settings import describe


def _write(tmp_path: Path, text: str, name: str = "cfg.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


RL_YAML = """\
env:
  id: corrgrpo/ScaleDominance-v0
optim:
  lr: {lr}
train:
  steps: 2
"""

SFT_YAML = """\
data:
  source: file
  files: [x.jsonl]
train:
  batch_size: {batch_size}
"""


def test_shared_sections_are_one_type():
    rl, sft = Config(), SFTConfig()
    assert type(rl.model) is type(sft.model) is ModelConfig
    assert isinstance(rl.optim, OptimizerConfig) and type(sft.optim) is OptimizerConfig
    assert isinstance(rl.train, RunConfig) and isinstance(sft.train, RunConfig)
    shared = {f.name for f in dataclasses.fields(RunConfig)}
    assert shared <= {f.name for f in dataclasses.fields(type(sft.train))}
    # each command keeps its own defaults for the shared sections, also when a section is given
    assert (rl.optim.lr, sft.optim.lr, rl.train.steps, sft.train.steps) == (1e-3, 2e-5, 50, 100)


def test_loss_aggregation_modes_are_spelled_once():
    from corrgrpo.trainer.losses import AGG_MODES, LossConfig

    hint = typing.get_type_hints(type(Config().algorithm))["loss_agg_mode"]
    assert typing.get_args(typing.get_args(hint)[0]) == AGG_MODES
    meta = {f.name: f.metadata for f in dataclasses.fields(LossConfig)}
    assert meta["agg_mode"]["choices"] == AGG_MODES


def test_errors_name_the_file_line_key_and_allowed_values(tmp_path):
    path = _write(tmp_path, RL_YAML.format(lr=-1))
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    assert str(exc.value) == f"{path}:4: optim.lr: -1.0 is out of range; allowed: > 0"
    with pytest.raises(ConfigError, match=re.escape(f"{path}:6: unknown key 'train.stepz'; allowed keys: ")):
        load_config(_write(tmp_path, RL_YAML.format(lr=0.1).replace("steps", "stepz")))
    moved = _write(tmp_path, "env:\n  id: corrgrpo/ScaleDominance-v0\n  split: all\n", "moved.yaml")
    with pytest.raises(ConfigError, match=re.escape(f"{moved}:3: env.split: this setting belongs in train.split")):
        load_config(moved)
    # the same reader and messages for sft
    sft = _write(tmp_path, SFT_YAML.format(batch_size=0), "sft.yaml")
    with pytest.raises(ConfigError) as exc:
        load_sft_config(sft)
    assert str(exc.value) == f"{sft}:5: train.batch_size: 0 is out of range; allowed: >= 1"


def test_errors_name_the_override(tmp_path):
    path = _write(tmp_path, RL_YAML.format(lr=0.1))
    with pytest.raises(ConfigError) as exc:
        load_config(path, ["optim.lr=-1"])
    assert str(exc.value) == "override 'optim.lr=-1': optim.lr: -1.0 is out of range; allowed: > 0"
    with pytest.raises(ConfigError, match=re.escape("override 'model.lora.dropout=1': model.lora.dropout: 1.0 is out")):
        load_sft_config(_write(tmp_path, SFT_YAML.format(batch_size=2), "sft.yaml"), ["model.lora.dropout=1"])
    with pytest.raises(ConfigError, match=re.escape(
            "override 'algorithm.loss_options.clip_low=2': algorithm.loss_options.clip_low: 2.0 is out of range")):
        load_config(path, ["algorithm.loss_options.clip_low=2"])
    with pytest.raises(ConfigError, match=re.escape(
            "override 'algorithm.loss_agg_mode=mean': algorithm.loss_agg_mode: 'mean' is not allowed; "
            "allowed values: one of 'token-mean'")):
        load_config(path, ["algorithm.loss_agg_mode=mean"])
    # a key that moved names its home wherever it was written
    for key, home in MOVED_KEYS.items():
        value = "{}" if key.endswith("reward_weights") else "1"
        with pytest.raises(ConfigError, match=re.escape(f"{key}: this setting belongs in {home}")):
            load_config(path, [f"{key}={value}"])


def test_a_rule_between_settings_names_the_key_it_blames(tmp_path):
    path = _write(tmp_path, RL_YAML.format(lr=0.1) + "rollout:\n  overlap: true\n")
    with pytest.raises(ConfigError, match=re.escape(f"{path}: algorithm.tis_cap: null is not allowed with rollout.overlap=true")):
        load_config(path)


@pytest.mark.parametrize("command, defaults", [("train", Config()), ("sft", SFTConfig())])
def test_help_lists_every_setting_with_its_default(command, defaults, capsys):
    from corrgrpo.trainer.cli import main

    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = capsys.readouterr().out
    settings = describe(defaults)
    assert len(settings) > 30
    for s in settings:
        assert f"  {s.key}  (" in text, s.key
    assert "  optim.warmup_steps  (integer; allowed: >= 0)  [0]" in text
    assert "  model.lora.r  (integer; allowed: >= 0 (0: off))  [0]" in text
    assert "Linear warmup steps" in text
    # the overrides are optional, and said to be
    assert "[KEY=VALUE ...]" in text and "optional overrides:" in text
    positional = text.split("positional arguments:")[1].split("options:")[0]
    assert "KEY=VALUE" not in positional
    if command == "sft":
        assert "  optim.lr  (number; allowed: > 0)  [2e-05]" in text and "  train.steps  (" in text
        assert "  train.batch_size  (integer; allowed: >= 1)  [16]" in text


def test_env_id_rules_are_the_same_in_both_commands():
    from corrgrpo.trainer.config import config_from_dict
    from corrgrpo.trainer.sft import sft_config_from_dict

    cfg = config_from_dict({"env": {"id": ["openenv://a:1", "openenv://b:2"]}})
    assert cfg.env.id == "openenv://a:1,openenv://b:2"
    for build in (config_from_dict, sft_config_from_dict):
        with pytest.raises(ConfigError, match=re.escape("env.id: a list must hold openenv://HOST:PORT addresses")):
            build({"env": {"id": ["corrgrpo/ToolCall-v0"]}})
        with pytest.raises(ConfigError, match="env.id: expected an env id"):
            build({"env": {"id": 3}})


def test_the_settings_live_on_the_ground_floor_with_the_standard_library_only():
    """``corrgrpo_envs`` declares env settings with it and may not import ``trainer``."""
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys, corrgrpo_registry.settings; "
            "print(sorted(m for m in ('yaml', 'gymnasium', 'numpy', 'torch', 'corrgrpo.trainer', 'corrgrpo_envs') "
            "if m in sys.modules))")
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    with pytest.raises(ModuleNotFoundError):
        __import__("corrgrpo.trainer.settings")


def test_the_config_errors_are_one_config_error():
    from corrgrpo.trainer.estimators.reward_weights import WeightSpecError
    from corrgrpo.trainer.losses import LossConfigError
    from corrgrpo_registry.yaml_files import DuplicateKeyError

    for cls in (DuplicateKeyError, LossConfigError, WeightSpecError):
        assert issubclass(cls, ConfigError), cls
    assert LossConfigError("clip_low", "clip_low: bad").key == "clip_low"
