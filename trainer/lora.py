"""LoRA adapters through the ``peft`` library, for ``corrgrpo sft`` and ``corrgrpo train``.

``model.lora`` in a config turns it on (``r > 0``); the base weights are then
frozen and only the adapter matrices train. What leaves the trainer is always a
plain model:

* ``save_pretrained(folder)`` writes the MERGED weights (base + B @ A * alpha/r)
  as an ordinary transformers folder, plus the adapter itself in
  ``folder/lora_adapter/`` (a standard PEFT adapter folder, which plain
  transformers and vLLM ignore);
* :func:`merged_state_dict` gives the merged weights under the base model's
  parameter names: what a rollout engine (vLLM) loads after each update.

Merging never touches the trained model: the merged tensors are new ones, so the
base weights stay bit-identical (merging in place and unmerging would not be).

Resuming: a checkpoint's ``model/`` holds merged weights, which cannot be split
back into base and adapter. The model built for the resumed run already has the
base weights (they come from ``model.name_or_path`` again), so loading merged
weights into a LoRA model is a no-op and :func:`restore_adapter` loads the
adapter from the checkpoint.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corrgrpo_registry.settings import Range, num_field, validate

__all__ = [
    "LoraConfig",
    "ADAPTER_FOLDER",
    "PEFT_INSTALL_HINT",
    "apply_lora",
    "is_lora_model",
    "merged_state_dict",
    "save_merged",
    "restore_adapter",
    "trainable_parameters",
]

#: Sub-folder of a saved model folder that holds the PEFT adapter it was merged from.
ADAPTER_FOLDER = "lora_adapter"
PEFT_INSTALL_HINT = (
    "LoRA needs the 'peft' package: pip install -c constraints.txt peft "
    "(or the project's 'lora' extra)"
)


@dataclass
class LoraConfig:
    r: int = num_field(0, Range(low=0, note="(0: off)"))
    """Rank of the adapter matrices; 0 turns LoRA off (every weight trains)."""
    alpha: float = num_field(16.0, Range(low=0, low_open=True))
    """Scale numerator: the update is ``B @ A * alpha / r``."""
    dropout: float = num_field(0.0, Range(low=0, high=1, high_open=True))
    """Dropout on the adapter's input."""
    target_modules: list[str] = num_field(["all-linear"], min_length=1)
    """Module names (or suffixes) that get adapters; ``[all-linear]``: every linear layer but the
    output head."""


def lora_enabled(cfg: LoraConfig | None) -> bool:
    """Whether ``cfg`` asks for adapters."""
    return cfg is not None and cfg.r > 0


def _require_peft() -> Any:
    try:
        import peft
    except ImportError:
        raise ImportError(PEFT_INSTALL_HINT) from None
    return peft


@functools.cache
def _lora_model_class() -> type:
    """``PeftModelForCausalLM`` whose ``save_pretrained`` writes a merged, plain folder."""
    peft = _require_peft()

    class MergingLoraModel(peft.PeftModelForCausalLM):
        """A PEFT causal LM that saves merged weights (and its adapter beside them)."""

        def save_pretrained(self, save_directory: str | Path, **kwargs: Any) -> None:  # type: ignore[override]
            save_merged(self, save_directory)

        def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False):  # type: ignore[override]
            keys = list(state_dict)
            if any(k.startswith("base_model.") for k in keys):
                return super().load_state_dict(state_dict, strict=strict, assign=assign)
            # merged weights under the base model's names (a checkpoint's model/ folder): the
            # base weights are already those of model.name_or_path; restore_adapter loads the
            # adapter. Names that are not the base model's still mean a mismatch.
            import torch

            known = set(merged_state_dict(self, with_values=False))
            unexpected = [k for k in keys if k not in known]
            return torch.nn.modules.module._IncompatibleKeys([], unexpected)

    return MergingLoraModel


def apply_lora(model: Any, cfg: LoraConfig | None) -> Any:
    """Wrap ``model`` with LoRA adapters when ``cfg.r > 0``; otherwise return it unchanged.

    The base weights are frozen (``requires_grad=False``); the adapters are
    initialised by PEFT (A random, B zero: the wrapped model computes exactly
    what the base did).
    """
    if not lora_enabled(cfg):
        return model
    assert cfg is not None
    peft = _require_peft()
    validate(cfg, "model.lora")  # the config's own checks, for a LoraConfig built in code
    targets: str | list[str] = list(cfg.target_modules)
    if targets == ["all-linear"]:
        targets = "all-linear"
    peft_cfg = peft.LoraConfig(
        r=int(cfg.r),
        lora_alpha=float(cfg.alpha),
        lora_dropout=float(cfg.dropout),
        target_modules=targets,
        bias="none",
        task_type="CAUSAL_LM",
    )
    try:
        wrapped = _lora_model_class()(model, peft_cfg)
    except ValueError as exc:  # e.g. no module matches target_modules
        raise ValueError(f"model.lora.target_modules: {exc}") from None
    if getattr(model, "is_gradient_checkpointing", False):
        # the frozen embeddings' output must carry gradients into the recomputed layers
        model.enable_input_require_grads()
    return wrapped


def is_lora_model(model: Any) -> bool:
    """Whether ``model`` (possibly wrapped by DDP) carries PEFT adapters."""
    model = getattr(model, "module", model)
    try:
        import peft
    except ImportError:
        return False
    return isinstance(model, peft.PeftModel)


def trainable_parameters(model: Any) -> tuple[int, int]:
    """``(trainable, total)`` parameter counts."""
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return trainable, total


def merged_state_dict(model: Any, with_values: bool = True) -> dict[str, Any]:
    """The weights a plain copy of ``model`` would have, under the base model's names.

    For a LoRA model, each adapted layer's weight is ``W + B @ A * alpha / r`` (new
    tensors: the model is unchanged) and the adapter tensors are left out; any
    other model's ``state_dict()`` is returned as is. ``with_values=False`` only
    lists the names (values ``None``) without computing any merge.
    """
    model = getattr(model, "module", model)
    if not is_lora_model(model):
        sd = model.state_dict()
        return sd if with_values else dict.fromkeys(sd)
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    layers = {name: m for name, m in base.named_modules() if isinstance(m, LoraLayer)}
    out: dict[str, Any] = {}
    for key, value in base.state_dict().items():
        if ".lora_" in key:
            continue
        plain = key.replace(".base_layer.", ".")
        if with_values:
            module_name, _, leaf = plain.rpartition(".")
            layer = layers.get(module_name)
            if layer is not None and leaf == "weight" and not layer.merged:
                value = value.detach().clone()
                for adapter in layer.active_adapters:
                    if adapter in layer.lora_A:
                        value += layer.get_delta_weight(adapter).to(value.dtype)
            else:
                value = value.detach()
        out[plain] = value if with_values else None
    return out


def save_merged(model: Any, folder: str | Path, tokenizer: Any = None, state_dict: dict[str, Any] | None = None) -> Path:
    """Write ``model`` as a plain transformers folder (merged weights for a LoRA model).

    A LoRA model's adapter goes to ``folder/lora_adapter/`` as well. ``state_dict``: the
    weights to write for a model without adapters (e.g. gathered from FSDP shards).
    """
    folder = Path(folder)
    model = getattr(model, "module", model)
    if is_lora_model(model):
        base = model.get_base_model()
        base.save_pretrained(folder, state_dict=merged_state_dict(model), safe_serialization=True)
        import peft

        peft.PeftModel.save_pretrained(model, folder / ADAPTER_FOLDER, safe_serialization=True)
    else:
        model.save_pretrained(folder, safe_serialization=True, state_dict=state_dict)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    return folder


def restore_adapter(model: Any, checkpoint: str | Path) -> bool:
    """Load the adapter saved in ``checkpoint/model/lora_adapter`` (or ``checkpoint/lora_adapter``).

    Returns False (and does nothing) for a model without adapters; raises when a
    LoRA model's checkpoint has no adapter.
    """
    model = getattr(model, "module", model)
    if not is_lora_model(model):
        return False
    from peft.utils import set_peft_model_state_dict
    from safetensors.torch import load_file

    checkpoint = Path(checkpoint)
    for folder in (checkpoint / "model" / ADAPTER_FOLDER, checkpoint / ADAPTER_FOLDER):
        weights = folder / "adapter_model.safetensors"
        if weights.is_file():
            result = set_peft_model_state_dict(model, load_file(str(weights)))
            unexpected = getattr(result, "unexpected_keys", [])
            if unexpected:
                raise RuntimeError(f"{weights} does not match the model's adapters: {unexpected[:5]}")
            return True
    raise FileNotFoundError(
        f"{checkpoint} has no LoRA adapter ({ADAPTER_FOLDER}/adapter_model.safetensors): "
        "was it saved by a run without model.lora?"
    )
