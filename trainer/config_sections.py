"""The sections of a run config (``corrgrpo train``): dataclasses with a docstring and an
allowed range per field.

A run is described by a YAML file (see ``env_configs/``) with the sections ``env``, ``model``,
``algorithm``, ``rollout``, ``optim`` and ``train``; :mod:`corrgrpo.trainer.config` reads it. The
``env`` section becomes the settings object of its env (chosen by ``env.id``), and the
estimator's and loss's options the classes that declare them (:mod:`corrgrpo.trainer.config_rules`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from corrgrpo.trainer.config_rules import MOVED_KEYS, check_plugins, check_rewards
from corrgrpo.trainer.lora import LoraConfig
from corrgrpo.trainer.loss_aggregation import AGG_MODES
from corrgrpo_envs.settings import EnvSection
from corrgrpo_registry.settings import ConfigError, Range, num_field, read_field

__all__ = [
    "AlgorithmConfig",
    "Config",
    "DEFAULT_ENV_ID",
    "LOSS_AGG_MODES",
    "ModelConfig",
    "OptimConfig",
    "OptimizerConfig",
    "RolloutConfig",
    "RolloutServerConfig",
    "RunConfig",
    "TRACKERS",
    "TrainConfig",
]


#: How per-token loss terms become one number (verl's ``loss_agg_mode``): the loss module's list.
LOSS_AGG_MODES = AGG_MODES
#: Accelerate's trackers (``accelerate.tracking.LOGGER_TYPE_TO_CLASS``), named here so that a
#: config is checked before Accelerate (and torch) are imported; ``none`` turns them off.
TRACKERS = ("tensorboard", "wandb", "mlflow", "trackio", "comet_ml", "aim", "clearml", "dvclive", "swanlab", "none")

_ANY = Range()
_POSITIVE_INT = Range(low=1)
_NON_NEGATIVE = Range(low=0)


@dataclass
class ModelConfig:
    name_or_path: str = "tiny"
    """Hub id or local path of a causal LM, or a built-in: ``tiny`` (random-init Qwen2 with a
    tokenizer trained on the fly), ``tiny-anchor`` (the TRL anchor's model), ``smollm2-135m``."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Parameter dtype for training."""
    tokenizer_file: str | None = None
    """Tokenizer JSON for ``tiny-anchor`` (default: the anchor tokenizer of the shared folder)."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass to save memory."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA adapters through ``peft`` (``r``, ``alpha``, ``dropout``, ``target_modules``); off
    while ``r`` is 0. Only the adapters train; saved models are merged plain folders."""


@dataclass
class AlgorithmConfig:
    estimator: str = "corrgrpo"
    """Advantage estimator: ``corrgrpo``, ``grpo``, ``dr_grpo``, ``gdpo``, ``mo_grpo``, ``gdpo_corr``,
    ``rloo``, ``reinforce_pp``, one registered with ``corrgrpo.trainer.estimators.register_estimator``, or
    an entry point ``package.module:function``."""
    estimator_options: Mapping[str, Any] = field(default_factory=dict)
    """Keyword options of the estimator (e.g. ``{scale: batch}`` for grpo, ``{eps: 1e-6}``): its
    keyword-only parameters, read at load into the estimator's options class
    (``corrgrpo.trainer.estimators.registry.options_class``); another key is an error."""
    loss: str = "grpo"
    """Policy loss: ``grpo`` (PPO clip), ``dapo``, ``dr_grpo``, ``cispo``, ``gspo``, a registered
    one, or an entry point ``package.module:function``."""
    loss_options: Any = field(default_factory=dict, metadata={"doc_type": "mapping"})
    """Hyper-parameters of the loss, fields of its ``LossConfig`` (default: the loss's paper
    values): ``clip_low``, ``clip_high``, ``dual_clip``, ``cispo_clip_low``,
    ``max_completion_length``; read at load into the loss's ``LossConfig``
    (``corrgrpo.trainer.losses``)."""
    loss_agg_mode: Literal[LOSS_AGG_MODES] | None = None
    """How per-token terms are averaged (default: the loss's own): ``token-mean`` over all
    tokens of the batch, ``seq-mean-token-sum`` (each sequence's token sum, mean over
    sequences), ``seq-mean-token-mean`` (each sequence's token mean, mean over sequences),
    ``seq-mean-token-sum-norm`` (token sums over the maximum completion length, Dr. GRPO)."""
    tis_cap: float | None = num_field(None, Range(low=1))
    """Truncated importance sampling: weight each token's policy term by
    ``min(pi_train / pi_sampler, tis_cap)`` with the sampler's own log-probabilities, which
    corrects for a rollout engine whose numbers differ from the trainer's (None: off)."""
    group_size: int = num_field(8, Range(low=2, note="(group estimators need 2 rollouts per task)"))
    """G: rollouts per task."""
    prompts_per_step: int = num_field(8, _POSITIVE_INT)
    """P: tasks per optimizer step (over all processes)."""
    reward_weights: list[Any] | dict[str, Any] | None = None
    """Weights of the reward components (default: the environment's): a list with one entry per
    component or a mapping by component name; an entry is a number or a piecewise-linear
    schedule over steps ``{values: [[0, 0.5], [100, 1.5]]}`` (``corrgrpo.trainer.estimators.reward_weights``)."""
    reward_gates: dict[str, Any] = field(default_factory=dict)
    """Gated components: ``{correct: [format, compile]}`` scores ``correct`` at its lower bound
    unless every gate is at its upper bound; ``{correct: {format: 1.0, compile: 0.5}}`` gives
    each gate a threshold (``corrgrpo.trainer.estimators.reward_gates``). Applied to the raw reward vectors."""
    kl_beta: float = num_field(0.0, _NON_NEGATIVE)
    """Weight of the k3 KL penalty against a frozen copy of the initial model (0: no reference)."""
    dynamic_sampling: bool | None = None
    """Drop groups whose raw reward vectors are all equal and sample more (default: on for dapo)."""
    max_resample_rounds: int = num_field(3, _NON_NEGATIVE)
    """How many extra rounds of sampling dynamic sampling may use to fill the batch."""
    overlong_buffer: int | None = num_field(None, _POSITIVE_INT)
    """DAPO overlong shaping: buffer length L_cache in tokens; adds an ``overlong`` reward
    component that falls from 0 to -1 as a turn's length goes from ``rollout.max_new_tokens -
    overlong_buffer`` to ``rollout.max_new_tokens`` (the per-turn budget, the longest turn counts)."""
    overlong_weight: float = num_field(1.0, _ANY)
    """Weight of the ``overlong`` component."""


@dataclass
class RolloutServerConfig:
    """The ``server`` rollout backend: ``vllm serve`` processes reached over HTTP."""

    urls: list[str] = field(default_factory=list)
    """API roots of the servers, e.g. ``[http://10.0.0.2:8000/v1, http://10.0.0.3:8000/v1]``
    (``scripts/vllm_serve.sh`` starts them); requests are spread over them."""
    model: str | None = None
    """The served model name (default: the first one the first server lists)."""
    concurrency: int = num_field(32, _POSITIVE_INT)
    """Most requests in flight per server."""
    timeout: float = num_field(300.0, Range(low=0, low_open=True))
    """Seconds per request attempt (and per weight-push call)."""
    retries: int = num_field(2, _NON_NEGATIVE)
    """Extra attempts of a failed request (timeouts, connection errors, 429, 5xx), each on the
    next server."""
    generation_retries: int = num_field(1, _NON_NEGATIVE)
    """After a request failed for good: how many times to wait for the servers to answer again
    (``recovery_timeout``), bring their weights up to date and generate the turn again
    (0: the run stops with an error naming the server; its last checkpoint stays intact)."""
    recovery_timeout: float = num_field(120.0, _NON_NEGATIVE)
    """Seconds to wait for a failed server to answer its health check again."""
    startup_timeout: float = num_field(600.0, _NON_NEGATIVE)
    """Seconds to wait for every server to come up when the run starts."""
    weights_dir: str | None = None
    """Folder the trainer writes each step's weights (safetensors) into, readable by every
    server (a shared file system across machines; default: a temporary folder)."""
    server_weights_dir: str | None = None
    """The same folder as the servers see it, when it is mounted elsewhere there."""
    weight_sync: Literal["disk", "nccl"] = "disk"
    """How weights reach the servers after each step: ``disk`` (safetensors in ``weights_dir``,
    reloaded in place through ``/collective_rpc``; any device) or ``nccl`` (vLLM's NCCL weight
    transfer from the trainer's GPU; servers started with ``WEIGHT_TRANSFER=nccl``)."""
    nccl_address: str | None = None
    """``nccl``: the trainer's address the servers can reach (the NCCL rendezvous host)."""
    nccl_port: int = num_field(29600, Range(low=1, high=65535))
    """``nccl``: rendezvous port of the first server's group (server i: this + i)."""


@dataclass
class RolloutConfig:
    max_new_tokens: int = num_field(32, _POSITIVE_INT)
    """Maximum tokens generated per turn."""
    temperature: float = num_field(1.0, _NON_NEGATIVE)
    """Sampling temperature (0: greedy)."""
    top_p: float = num_field(1.0, Range(low=0, high=1, low_open=True))
    """Nucleus sampling threshold."""
    stop: list[str] = field(default_factory=list)
    """Stop strings that end a turn."""
    max_turns: int = num_field(1, _POSITIVE_INT)
    """Turns per episode; also given to envs whose constructor takes ``max_turns``."""
    backend: str = "hf"
    """Rollout engine: ``hf`` (transformers ``generate`` on the training model), ``vllm``
    (a colocated vLLM engine) or ``server`` (``vllm serve`` processes, see ``rollout.server``);
    others register in ``corrgrpo.trainer.engines``."""
    vllm_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of ``vllm.LLM`` for the ``vllm`` backend (``gpu_memory_utilization``,
    ``max_model_len``, ``enforce_eager``, ``enable_sleep_mode``, ...)."""
    server: RolloutServerConfig = field(default_factory=RolloutServerConfig)
    """The ``server`` backend's servers, timeouts, retries and weights folder."""
    groups_per_generate: int | None = num_field(None, _POSITIVE_INT)
    """Groups per generation call (default: all of a process's groups in one call). Setting 1
    makes sampling independent of how groups are spread over processes."""
    reward_workers: int = num_field(1, _POSITIVE_INT)
    """Parallel workers that compute rewards (code execution and AgentDojo checks are costly)."""
    reward_executor: Literal["thread", "process"] = "thread"
    """Pool kind for reward workers."""
    hf_decoder: Literal["auto", "static", "generate"] = "auto"
    """How the ``hf`` backend decodes: ``auto`` (a loop with a preallocated KV cache for
    Qwen2/Llama/Mistral models, same draws as ``generate`` and faster; ``generate`` for
    others), ``static`` (that loop; an error for other models) or ``generate``."""
    hf_share_prompts: bool = True
    """The ``hf`` backend prefills each distinct prompt of a generation call once (a group's G
    rollouts share one); with the static decoder and groups of equal size each decode step then
    reads that prompt's key/value cache once per group (otherwise the cache is copied to the
    rows that repeat it): the same draws and, within float rounding, the same logprobs as one
    prefill per row, at a fraction of the prefill's cost (prompts of 64 tokens or more;
    BENCHMARKS.md). ``false``: one prefill per row."""
    torch_threads: int | None = num_field(None, _POSITIVE_INT)
    """Torch threads per process (default: this process's share of the cores minus its
    reward worker processes, at least 1; see ``corrgrpo.trainer.threads``)."""
    overlap: bool = False
    """Generate step t+1's rollouts while step t updates (``corrgrpo.trainer.overlap``): a worker thread
    samples from a copy of the policy synced after each update, so rollouts are one step
    stale; needs ``algorithm.tis_cap`` (the importance correction against the sampler)."""


@dataclass
class OptimizerConfig:
    """The optimizer and learning-rate schedule: the part of ``optim`` every command shares."""

    lr: float = num_field(1e-3, Range(low=0, low_open=True))
    """Peak learning rate of AdamW."""
    weight_decay: float = num_field(0.0, _NON_NEGATIVE)
    """AdamW weight decay."""
    betas: list[float] = num_field([0.9, 0.999], Range(low=0, high=1, high_open=True), length=2)
    """AdamW betas (two numbers in [0, 1))."""
    adam_eps: float = num_field(1e-8, Range(low=0, low_open=True))
    """AdamW epsilon."""
    schedule: Literal["constant", "linear", "cosine"] = "linear"
    """Learning-rate schedule after warmup (linear and cosine decay to 0 at the last step)."""
    warmup_steps: int = num_field(0, _NON_NEGATIVE)
    """Linear warmup steps: the learning rate is lr/N, 2 lr/N, ..., lr over the first N steps."""
    max_grad_norm: float = num_field(1.0, Range(low=0, note="(0 disables clipping)"))
    """Gradient clipping norm (0 disables)."""


@dataclass
class OptimConfig(OptimizerConfig):
    """``corrgrpo train``'s ``optim``: the shared optimizer settings and the update's batching."""

    epochs: int = num_field(1, _POSITIVE_INT)
    """Update epochs over each batch of rollouts."""
    mini_batch_size: int | None = num_field(None, Range(low=1, note="(or null: the whole batch)"))
    """Sequences per optimizer update (over all processes; default: the whole batch)."""
    micro_batch_size: int | None = num_field(None, Range(low=1, note="(or null: the mini-batch)"))
    """Sequences per forward pass on one process (gradient accumulation; default: the mini-batch)."""
    share_prefix: bool = False
    """Run a micro-batch's common prompt prefix through the model once, and each sequence's rest on
    top of its key/value cache: the same log-probabilities and gradient up to float rounding, at
    about ``P + G A`` token passes instead of ``G (P + A)`` for a group of G answers of A tokens to
    one prompt of P (2.8x faster on SmolLM2 with P = 780, A = 110, G = 8). Pays when prompts are
    long and ``micro_batch_size`` holds whole groups (rollouts are batched group by group). One
    process (with several, each one's micro-batch runs two forward passes)."""


@dataclass
class RunConfig:
    """The part of ``train`` every command shares: length, seed, run folder, checkpoints, output."""

    steps: int = num_field(50, _POSITIVE_INT)
    """Number of optimizer steps (train: one batch of P x G rollouts each)."""
    seed: int = num_field(0, Range(low=0, high=2**63 - 1))
    """Seed of the model init, task or example order, and sampling."""
    output_dir: str | None = None
    """Run folder (default: ``runs/<config name>-<estimator>-s<seed>`` for train,
    ``runs/<config name>-sft-s<seed>`` for sft)."""
    save_every: int = num_field(0, Range(low=0, note="(0: only at the end)"))
    """Save a checkpoint every N steps (0: only at the end)."""
    save_final: bool = True
    """Save a checkpoint after the last step."""
    keep_checkpoints: int = num_field(0, Range(low=0, note="(0: all)"))
    """Keep only the newest N ``checkpoint-<step>`` folders: after each save the older ones are
    deleted (each holds the weights and AdamW's two moments, three times the model's size)."""
    resume: str | None = None
    """Checkpoint folder to resume from, or ``auto`` for the latest one in the run folder."""
    progress: bool = True
    """Show a progress bar."""
    report_to: list[Literal[TRACKERS]] | Literal[TRACKERS] = field(default_factory=lambda: ["tensorboard"])
    """Experiment trackers, through Accelerate's tracker API: any of ``tensorboard`` (event
    files in the run folder's ``tensorboard/``), ``wandb``, ``mlflow``, ``trackio``,
    ``comet_ml``, ``aim``, ``clearml``, ``dvclive``, ``swanlab``, or ``none``;
    ``metrics.jsonl`` is written in every case. Each tracker reads its own settings from its
    environment variables (e.g. ``WANDB_MODE=offline``; ``MLFLOW_TRACKING_URI=file:./mlruns``
    with ``MLFLOW_ALLOW_FILE_STORE=true``, which MLflow 3 needs for local files; ``TRACKIO_DIR``).
    One not installed is skipped with a line saying so; one that fails to start ends the run
    with a line naming it."""
    project: str = "corrgrpo"
    """The trackers' project (wandb and trackio project, MLflow experiment); the run is named
    after the run folder."""
    tensorboard: bool = True
    """``false`` drops ``tensorboard`` from ``report_to`` (the older switch)."""
    cpu: bool = False
    """Force the CPU even when a GPU is available."""

    def check_rules(self) -> None:
        """``none`` stands alone in ``report_to``."""
        chosen = [self.report_to] if isinstance(self.report_to, str) else list(self.report_to)
        if "none" in chosen and len(chosen) > 1:
            raise ConfigError(f"train.report_to: 'none' cannot be combined with other trackers, got {chosen}", "train.report_to")

    def trackers(self) -> list[str]:
        """The trackers to start: ``report_to`` without ``none``, repeats, or (with
        ``tensorboard: false``) TensorBoard."""
        chosen = [self.report_to] if isinstance(self.report_to, str) else list(self.report_to)
        return [t for t in dict.fromkeys(chosen) if t != "none" and (self.tensorboard or t != "tensorboard")]


@dataclass
class TrainConfig(RunConfig):
    """``corrgrpo train``'s ``train``: the shared run settings, the task split and logged samples."""

    split: Literal["train", "eval", "all"] = "train"
    """Task split to train on (given to the environment)."""
    log_samples: int = num_field(1, _NON_NEGATIVE)
    """Completions written to ``samples.jsonl`` per step (0: none)."""


#: The env of a config without an ``env:`` section.
DEFAULT_ENV_ID = "corrgrpo/ScaleDominance-v0"


def _read_env(value: Any, key: str, moved: Mapping[str, str]) -> EnvSection:
    """The ``env:`` section as the settings object of its env (``corrgrpo_envs.registry.read_env_section``)."""
    from corrgrpo_envs.registry import read_env_section

    return read_env_section(value, moved, f"e.g. {DEFAULT_ENV_ID}")


def _default_env() -> EnvSection:
    return _read_env({"id": DEFAULT_ENV_ID}, "env", MOVED_KEYS)


@dataclass
class Config:
    env: EnvSection = read_field(_read_env, _default_env)
    """The environment: ``id`` (a registered id, ``package.module:Class`` or
    ``openenv://HOST:PORT``) plus its keyword arguments, read at load into the env's settings
    class (the built-in envs' keys are listed below; an env registered without one gets its
    keyword arguments unchecked); ``split``, ``max_turns`` and ``reward_weights`` belong to the
    trainer. ``import``: modules to import first (e.g. ``[mypkg.envs]``, whose import registers
    ``myorg/Polite-v0``)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    name: str = "run"
    """Name of the run (default: the config file's stem)."""

    def check_rules(self) -> None:
        """The rules that relate settings (run by :func:`corrgrpo_registry.settings.validate`);
        the estimator's and loss's options are read into their declared classes here."""
        check_rewards(self)
        check_plugins(self)
