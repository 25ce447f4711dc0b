"""Training configuration: dataclasses with a docstring per field.

A run is described by a YAML file (see ``env_configs/``) with the sections
``env``, ``model``, ``algorithm``, ``rollout``, ``optim`` and ``train``, and
may be overridden on the command line with dotted keys::

    corrgrpo train env_configs/quickstart.yaml algorithm.estimator=grpo train.seed=3

Unknown keys and values of the wrong type are errors that name the key and
what is allowed.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

__all__ = [
    "Config",
    "ModelConfig",
    "AlgorithmConfig",
    "RolloutConfig",
    "OptimConfig",
    "TrainConfig",
    "ConfigError",
    "load_config",
    "config_from_dict",
    "apply_overrides",
    "config_to_dict",
]


class ConfigError(ValueError):
    """A configuration key or value is not allowed."""


@dataclass
class ModelConfig:
    name_or_path: str = "tiny"
    """Hub id or local path of a causal LM, or a built-in: ``tiny`` (random-init Qwen2 with a
    tokenizer trained on the fly), ``tiny-anchor`` (the TRL anchor's model), ``smollm2-135m``."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Parameter dtype for training."""
    tokenizer_file: str | None = None
    """Tokenizer JSON for ``tiny-anchor`` (default: ``../shared/anchors/tiny_bpe_1024.tokenizer.json``)."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass to save memory."""


@dataclass
class AlgorithmConfig:
    estimator: str = "corrgrpo"
    """Advantage estimator: ``corrgrpo``, ``grpo``, ``dr_grpo``, ``gdpo``, ``mo_grpo``, ``gdpo_corr``
    or one registered with ``trainer.advantages.register_estimator``."""
    estimator_options: dict[str, Any] = field(default_factory=dict)
    """Extra keyword options of the estimator (e.g. ``{scale: batch}`` for grpo, ``{eps: 1e-6}``)."""
    loss: str = "grpo"
    """Policy loss: ``grpo`` (PPO clip), ``dapo``, ``dr_grpo``, ``cispo``, ``gspo`` or a registered one."""
    group_size: int = 8
    """G: rollouts per task."""
    prompts_per_step: int = 8
    """P: tasks per optimizer step (over all processes)."""
    reward_weights: list[float] | None = None
    """Weights of the reward components (default: the environment's)."""
    clip_low: float | None = None
    """Lower clip range epsilon (default: the loss's own)."""
    clip_high: float | None = None
    """Upper clip range epsilon (default: the loss's own; 0.28 for dapo)."""
    dual_clip: float | None = None
    """Dual-clip constant c for negative advantages (3.0 in the paper's runs; None disables)."""
    kl_beta: float = 0.0
    """Weight of the k3 KL penalty against a frozen copy of the initial model (0 disables it)."""
    dynamic_sampling: bool | None = None
    """Drop groups whose raw reward vectors are all equal and sample more (default: on for dapo)."""
    max_resample_rounds: int = 3
    """How many extra rounds of sampling dynamic sampling may use to fill the batch."""
    overlong_buffer: int | None = None
    """DAPO overlong shaping: buffer length L_cache; adds an ``overlong`` reward component."""
    overlong_weight: float = 1.0
    """Weight of the ``overlong`` component."""


@dataclass
class RolloutConfig:
    max_new_tokens: int = 32
    """Maximum tokens generated per turn."""
    temperature: float = 1.0
    """Sampling temperature (0: greedy)."""
    top_p: float = 1.0
    """Nucleus sampling threshold."""
    stop: list[str] = field(default_factory=list)
    """Stop strings that end a turn."""
    max_turns: int = 1
    """Upper bound on turns per episode (multi-turn envs also have their own limit)."""
    backend: Literal["hf", "vllm"] = "hf"
    """Generation backend: transformers ``generate`` or a colocated vLLM engine."""
    vllm_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of ``vllm.LLM`` for the ``vllm`` backend (``gpu_memory_utilization``,
    ``max_model_len``, ``enforce_eager``, ``enable_sleep_mode``, ...)."""
    groups_per_generate: int | None = None
    """Groups per generation call (default: all of a process's groups in one call). Setting 1
    makes sampling independent of how groups are spread over processes."""
    reward_workers: int = 1
    """Parallel workers that compute rewards (code execution and AgentDojo checks are costly)."""
    reward_executor: Literal["thread", "process"] = "thread"
    """Pool kind for reward workers."""


@dataclass
class OptimConfig:
    lr: float = 1e-3
    """Peak learning rate of AdamW."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    """AdamW betas."""
    adam_eps: float = 1e-8
    """AdamW epsilon."""
    schedule: Literal["constant", "linear", "cosine"] = "linear"
    """Learning-rate schedule after warmup (linear and cosine decay to 0 at the last step)."""
    warmup_steps: int = 0
    """Linear warmup steps."""
    max_grad_norm: float = 1.0
    """Gradient clipping norm (0 disables)."""
    epochs: int = 1
    """Update epochs over each batch of rollouts."""
    mini_batch_size: int | None = None
    """Sequences per optimizer update (over all processes; default: the whole batch)."""
    micro_batch_size: int | None = None
    """Sequences per forward pass on one process (gradient accumulation; default: the mini-batch)."""


@dataclass
class TrainConfig:
    steps: int = 50
    """Number of training steps (one batch of P x G rollouts each)."""
    seed: int = 0
    """Seed of the model init, task order and sampling."""
    output_dir: str | None = None
    """Run folder (default: ``runs/<config name>-<estimator>-s<seed>``)."""
    save_every: int = 0
    """Save a checkpoint every N steps (0: only at the end)."""
    save_final: bool = True
    """Save a checkpoint after the last step."""
    resume: str | None = None
    """Checkpoint folder to resume from, or ``auto`` for the latest one in the run folder."""
    progress: bool = True
    """Show a progress bar."""
    tensorboard: bool = True
    """Also write TensorBoard event files."""
    cpu: bool = False
    """Force the CPU even when a GPU is available."""
    split: Literal["train", "eval", "all"] = "train"
    """Task split to train on."""
    log_samples: int = 1
    """Completions printed to ``samples.jsonl`` per step (0: none)."""


@dataclass
class Config:
    env: dict[str, Any] = field(default_factory=lambda: {"id": "corrgrpo/ScaleDominance-v0"})
    """The environment: ``id`` plus its keyword arguments."""
    model: ModelConfig = field(default_factory=ModelConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    name: str = "run"
    """Name of the run (default: the config file's stem)."""


# ------------------------------------------------------------------- parsing
def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "null"
    if origin is not None:
        return getattr(origin, "__name__", str(tp))
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against the annotation ``tp``; ints are accepted for floats."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin is Literal:
        if value in typing.get_args(tp):
            return value
        raise ConfigError(f"{key}: {value!r} is not allowed; allowed values: {_type_name(tp)}")
    if origin in (typing.Union, types.UnionType):
        errors = []
        for arg in typing.get_args(tp):
            try:
                return _coerce(value, arg, key)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(f"{key}: expected {_type_name(tp)}, got {value!r}")
    if tp is type(None):
        if value is None:
            return None
        raise ConfigError(f"{key}: expected null, got {value!r}")
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads "1e-3" (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        (item_tp,) = typing.get_args(tp) or (Any,)
        return [_coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        return dict(value)
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, key)
    raise ConfigError(f"{key}: unsupported type {tp}")


def _build(cls: type, data: Any, prefix: str = "") -> Any:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix or 'config'}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        full = f"{prefix}.{key}" if prefix else str(key)
        if key not in fields:
            raise ConfigError(f"unknown key {full!r}; allowed keys: {', '.join(sorted(fields))}")
        kwargs[key] = _coerce(value, hints[key], full)
    return cls(**kwargs)


def config_from_dict(data: dict[str, Any]) -> Config:
    """Build and validate a :class:`Config` from a plain mapping."""
    cfg = _build(Config, data)
    if "id" not in cfg.env:
        raise ConfigError("env: needs an 'id' key (e.g. corrgrpo/ScaleDominance-v0)")
    _check(cfg)
    return cfg


def _check(cfg: Config) -> None:
    a, r, o = cfg.algorithm, cfg.rollout, cfg.optim
    positive = {
        "algorithm.group_size": a.group_size,
        "algorithm.prompts_per_step": a.prompts_per_step,
        "rollout.max_new_tokens": r.max_new_tokens,
        "rollout.max_turns": r.max_turns,
        "optim.epochs": o.epochs,
        "train.steps": cfg.train.steps,
    }
    for key, value in positive.items():
        if value < 1:
            raise ConfigError(f"{key}: must be >= 1, got {value}")
    if a.group_size < 2:
        raise ConfigError("algorithm.group_size: group estimators need at least 2 rollouts per task")
    if o.lr <= 0:
        raise ConfigError(f"optim.lr: must be > 0, got {o.lr}")
    if r.temperature < 0:
        raise ConfigError(f"rollout.temperature: must be >= 0, got {r.temperature}")


def config_to_dict(cfg: Config) -> dict[str, Any]:
    """The config as plain data (for saving next to a run)."""
    return dataclasses.asdict(cfg)


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``a.b.c=value`` overrides (values parsed as YAML) to a nested mapping."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like section.key=value")
        key, raw = item.split("=", 1)
        value = yaml.safe_load(raw) if raw != "" else None
        parts = key.strip().split(".")
        node = data
        for part in parts[:-1]:
            if node.get(part) is None:
                node[part] = {}
            if not isinstance(node[part], dict):
                raise ConfigError(f"override {key!r}: {part!r} is not a section")
            node = node[part]
        node[parts[-1]] = value
    return data


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> Config:
    """Read a YAML config (or the defaults when ``path`` is None) and apply overrides."""
    data: dict[str, Any] = {}
    name = "run"
    if path is not None:
        from corrgrpo_envs.registry import resolve_config_path

        resolved = resolve_config_path(path)
        with open(resolved, encoding="utf-8") as f:
            data = yaml.safe_load(f) or {}
        if not isinstance(data, dict):
            raise ConfigError(f"{resolved}: expected a mapping at the top level")
        name = resolved.stem
    data.setdefault("name", name)
    data = apply_overrides(data, overrides or [])
    return config_from_dict(data)
