"""Training FLOPs, measured: every network pass a training step actually runs, forward and
backward, counted as it runs, so that compute multipliers between processes are per FLOP.

A FLOP here is one floating-point operation of a matrix multiply or of attention, as
``torch.utils.flop_counter`` counts them: 2 per multiply-add (about 6 N per token for a
forward and backward pass through N weights), dense attention at 4 L^2 d per layer forward
(masked and causal pairs included, as a fused kernel computes them). Elementwise work, norms,
softmax, embedding lookups and the optimizer are not counted. Measuring rather than declaring
catches what a formula would have to be told: self-conditioning's second pass (drawn at
random each step), a two-stream layout (x_t beside x_0, twice the sequence), an AR phase,
activation recomputation.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count


def _cpu_attention(query, key, value, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query, key, value)


def _cpu_attention_backward(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
    return sdpa_backward_flop_count(grad_out, query, key, value)


# torch counts the CUDA attention kernels only; the CPU's fused one would count as nothing
CPU_ATTENTION = {
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_attention,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_attention_backward,
}


def flop_counter() -> FlopCounterMode:
    """A ``FlopCounterMode`` that also counts CPU attention, silent."""
    return FlopCounterMode(display=False, custom_mapping=CPU_ATTENTION)


class FlopCount(L.Callback):
    """Counts each training batch's FLOPs (forward, backward, every pass it runs; the module
    docstring's definition) and logs ``train/step_flops`` (this step's, all processes) and
    ``train/flops`` (the running total, kept in checkpoints so a resumed run continues it).
    Every rank counts its own batch; the logged figures are summed over ranks (each rank trains
    the same shapes, so rank 0's count times the world size)."""

    def __init__(self) -> None:
        self.total = 0
        self.step = 0
        self.counter: FlopCounterMode | None = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.counter = flop_counter()
        self.counter.__enter__()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.counter is None:
            return
        self.counter.__exit__(None, None, None)
        self.step = self.counter.get_total_flops() * trainer.world_size
        self.counter = None
        self.total += self.step
        pl_module.log("train/step_flops", float(self.step))
        pl_module.log("train/flops", float(self.total))

    def on_exception(self, trainer, pl_module, exception) -> None:
        if self.counter is not None:  # a step that raised leaves no mode behind
            self.counter.__exit__(None, None, None)
            self.counter = None

    def state_dict(self) -> dict[str, Any]:
        return {"total": self.total}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.total = state_dict["total"]
