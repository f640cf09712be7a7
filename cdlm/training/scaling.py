"""Scale-out on Lightning's own strategies (``trainer=ddp|fsdp``, docs/guide/scaling.md): the FSDP
strategy with one shard unit per Transformer block, the whole model out of a sharded run (for
the export, the model card and sample logging), and the batch a run trains with."""

from __future__ import annotations

import lightning as L
from hydra.utils import instantiate
from lightning.pytorch.strategies import FSDPStrategy
from lightning.pytorch.utilities import rank_zero_info
from torch import nn

from cdlm.networks.transformer import Block


def fsdp(
    sharding_strategy: str = "FULL_SHARD",
    activation_checkpointing: bool = False,
    **kwargs,
) -> FSDPStrategy:
    """Lightning's ``FSDPStrategy`` sharding by Transformer block (each ``Block`` is one FSDP
    unit: its weights are gathered for its own forward and freed after), optionally with
    activation checkpointing per block. ``state_dict_type="full"``: checkpoints and the exported
    model hold whole weights, readable without the run's world size."""
    return FSDPStrategy(
        auto_wrap_policy={Block},
        activation_checkpointing_policy={Block} if activation_checkpointing else None,
        sharding_strategy=sharding_strategy,
        state_dict_type="full",
        **kwargs,
    )


def is_sharded(trainer: L.Trainer) -> bool:
    """Whether the module's weights are split over processes (no process holds them all)."""
    return isinstance(trainer.strategy, FSDPStrategy)


def whole_model(trainer: L.Trainer, pl_module: L.LightningModule) -> tuple[nn.Module, nn.Module]:
    """(process, network) with every weight, on global rank 0; (None, None) on the others.

    Unsharded: the module's own. Under FSDP: a copy rebuilt from ``pl_module.model_config`` and
    loaded with the full state dict gathered to rank 0; the gather is a collective, so every rank
    must call this (callbacks that export call it from all ranks, then write from rank 0)."""
    if not is_sharded(trainer):
        own = (pl_module.process, pl_module.network)
        return own if trainer.is_global_zero else (None, None)
    state = trainer.strategy.lightning_module_state_dict()
    if not trainer.is_global_zero:
        return None, None
    config = pl_module.model_config
    parts = instantiate(config["process"]), instantiate(config["network"])
    for prefix, module in zip(("process.", "network."), parts, strict=True):
        module.load_state_dict(
            {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
        )
    return parts


def batch_sizes(trainer: L.Trainer, per_device: int, seq_len: int) -> dict[str, int]:
    """The per-device and the global batch (sequences per optimizer step over all processes and
    accumulated micro-batches), as the logger's hyperparameters and the model card state them."""
    processes, accumulate = trainer.world_size, trainer.accumulate_grad_batches
    global_batch = per_device * processes * accumulate
    return {
        "batch/per_device": per_device,
        "batch/processes": processes,
        "batch/accumulate": accumulate,
        "batch/global": global_batch,
        "batch/global_tokens": global_batch * seq_len,
    }


def batch_report(trainer: L.Trainer, per_device: int, seq_len: int) -> dict[str, int]:
    """``batch_sizes``, printed once."""
    b = batch_sizes(trainer, per_device, seq_len)
    rank_zero_info(
        f"cdlm-train: batch {per_device} per device x {b['batch/processes']} process(es) x "
        f"{b['batch/accumulate']} accumulated = {b['batch/global']} sequences "
        f"({b['batch/global_tokens']} tokens) per step"
    )
    return b
