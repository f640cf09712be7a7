"""The NaN/inf guard: a bad batch costs one skipped step, not the run (docs/guide/reliability.md).

A non-finite loss or gradient is skipped: the optimizer sees no gradient (AdamW then leaves the
weights and its moments untouched), and the buffers the process learned from that batch's loss
(a warped time sampler's loss curve) are put back. Each skip is warned about and counted
(``train/skipped_steps``); ``max_consecutive`` skips in a row mean the run has diverged, and it
stops with one line naming the step, before anything is written with broken weights.
"""

from __future__ import annotations

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_warn


class Diverged(RuntimeError):
    """Training stopped: too many non-finite steps in a row (``cdlm-train`` prints one line)."""


class NonFiniteGuard(L.Callback):
    """Skips optimizer steps whose loss or gradients are not finite.

    Args:
        max_consecutive: this many skipped steps in a row stop the run (``Diverged``).

    With a gradient scaler (``precision=16-mixed``) overflowing gradients are the scaler's to
    skip (it lowers its scale and retries), so only a non-finite loss counts there.
    """

    def __init__(self, max_consecutive: int = 5) -> None:
        if isinstance(max_consecutive, bool) or not (
            isinstance(max_consecutive, int) and max_consecutive >= 1
        ):
            raise ValueError(
                f"callbacks.guard.max_consecutive must be an integer >= 1, got {max_consecutive!r}"
            )
        self.max_consecutive = max_consecutive
        self.skipped, self.in_a_row = 0, 0
        self._loss: torch.Tensor | None = None
        self._buffers: dict[str, torch.Tensor] = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        process = getattr(pl_module, "process", None)
        if isinstance(process, torch.nn.Module):
            self._buffers = {k: b.detach().clone() for k, b in process.named_buffers()}
        self._loss = None

    def on_before_backward(self, trainer, pl_module, loss: torch.Tensor) -> None:
        self._loss = loss.detach()

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        grads = [
            p.grad
            for group in optimizer.param_groups
            for p in group["params"]
            if p.grad is not None
        ]
        checks = [] if self._loss is None else [self._loss.isfinite().all()]
        if grads and getattr(trainer.precision_plugin, "scaler", None) is None:
            checks.append(torch.stack(torch._foreach_norm(grads)).isfinite().all())
        finite = bool(torch.stack(checks).all()) if checks else True
        finite = trainer.strategy.reduce_boolean_decision(finite, all=True)  # every rank agrees
        if finite:
            self.in_a_row = 0
        else:
            self._skip(trainer, pl_module, optimizer)
        pl_module.log("train/skipped_steps", float(self.skipped))

    def _skip(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer) -> None:
        for group in optimizer.param_groups:
            for p in group["params"]:
                p.grad = None
        process = getattr(pl_module, "process", None)
        if isinstance(process, torch.nn.Module) and self._buffers:
            for name, buffer in process.named_buffers():
                if name in self._buffers:
                    buffer.copy_(self._buffers[name])
        self.skipped += 1
        self.in_a_row += 1
        step = trainer.global_step
        what = "loss" if self._loss is not None and not self._loss.isfinite().all() else "gradient"
        if self.in_a_row >= self.max_consecutive:
            raise Diverged(
                f"training diverged: non-finite {what} at {self.in_a_row} steps in a row, the last "
                f"at step {step}; the last good checkpoint is kept (resume=auto, or lower "
                "optimizer.lr)"
            )
        rank_zero_warn(
            f"step {step}: non-finite {what}, step skipped ({self.in_a_row} in a row, "
            f"{self.skipped} so far; {self.max_consecutive} in a row stop the run)"
        )

    def state_dict(self) -> dict[str, int]:
        return {"skipped": self.skipped, "in_a_row": self.in_a_row}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.skipped, self.in_a_row = state["skipped"], state["in_a_row"]
