"""Sharded training with FSDP2 through Accelerate: setup, full weights, sharded checkpoints.

``accelerate launch --config_file env_configs/accelerate/fsdp.yaml`` shards the policy
with ``torch.distributed.fsdp.fully_shard`` (FSDP2). The helpers here are what the
trainer needs on top of ``Accelerator.prepare``:

* :func:`build_accelerator`: the ``Accelerator`` of a run. Accelerate applies FSDP
  only on accelerators; on CPU processes (gloo) it would silently fall back to
  replicated DDP-style training, so a requested FSDP2 run is switched onto
  Accelerate's FSDP2 path here (``fully_shard`` itself runs on CPU over gloo);
* :func:`full_state_dict`: the full, unsharded weights (for ``save_pretrained`` and the
  vLLM weight sync): every process must call it;
* :func:`save_sharded_state` / :func:`load_sharded_state`: each process writes and
  reads only its own shards of the model and optimizer (``torch.distributed.checkpoint``).

Without FSDP every function reduces to the plain single-copy behaviour, so callers
need no branches of their own.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "build_accelerator",
    "fsdp_requested",
    "is_sharded",
    "full_state_dict",
    "save_sharded_state",
    "load_sharded_state",
    "SHARDED_DIR",
]

#: Folder of a checkpoint that holds the sharded model and optimizer state.
SHARDED_DIR = "sharded"


def fsdp_requested() -> bool:
    """Whether ``accelerate launch`` was given an FSDP config (it exports ``ACCELERATE_USE_FSDP``)."""
    return os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"


def build_accelerator(cpu: bool, **kwargs: Any) -> Any:
    """An ``Accelerator`` for a run; an FSDP2 config also shards CPU processes.

    Raises:
        ValueError: an FSDP config asks for FSDP1 on CPU processes (only FSDP2 runs there).
    """
    from accelerate import Accelerator
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    acc = Accelerator(cpu=cpu, **kwargs)
    if fsdp_requested() and acc.distributed_type == DistributedType.MULTI_CPU:
        plugin = FullyShardedDataParallelPlugin()  # read from the launcher's FSDP_* variables
        if plugin.fsdp_version != 2:
            raise ValueError(
                f"fsdp_config.fsdp_version: {plugin.fsdp_version} is not supported on CPU processes; "
                "use fsdp_version: 2"
            )
        if acc.mixed_precision != "no":
            plugin.set_mixed_precision(acc.mixed_precision)
        # Accelerate only enables FSDP for accelerator backends; the FSDP2 code path it
        # takes from here on (fully_shard, DTensor state dicts) is device-agnostic.
        acc.state.distributed_type = DistributedType.FSDP
        acc.state.fsdp_plugin = plugin
        PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    return acc


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether ``model`` was sharded by FSDP2's ``fully_shard``."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch without FSDP2
        return False
    return isinstance(model, FSDPModule)


def full_state_dict(model: torch.nn.Module, *, rank0_only: bool = False) -> dict[str, torch.Tensor]:
    """The model's full (unsharded) state dict; a collective call under FSDP.

    Args:
        rank0_only: gather to CPU on rank 0 only (for saving); other ranks get ``{}``.
            Otherwise every process gets the full tensors (for a weight sync per process).
    """
    if not is_sharded(model):
        from corrgrpo.trainer.lora import merged_state_dict

        return merged_state_dict(model)  # LoRA: adapters merged, under the base model's names
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=rank0_only)
    state = get_model_state_dict(model, options=options)
    if rank0_only and torch.distributed.get_rank() != 0:
        return {}
    return state


def save_sharded_state(path: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Path:
    """Write each process's shards of the model and optimizer under ``path/sharded``; collective."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    target = Path(path) / SHARDED_DIR
    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=str(target))
    return target


def load_sharded_state(path: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Restore the shards written by :func:`save_sharded_state` into ``model`` and ``optimizer``; collective.

    Raises:
        FileNotFoundError: ``path`` has no ``sharded`` folder (a checkpoint of an unsharded run).
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    source = Path(path) / SHARDED_DIR
    if not (source / ".metadata").exists():
        raise FileNotFoundError(
            f"{path} has no sharded state ({SHARDED_DIR}/.metadata): it was not saved by an FSDP run"
        )
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optim_state}
    dcp.load(state, checkpoint_id=str(source))
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"]
    )

