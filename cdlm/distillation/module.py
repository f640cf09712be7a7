"""The distillation LightningModule, beside ``DiffusionLM`` (not a subclass): a frozen teacher, a
student that starts from the teacher's weights, a ``method`` (``cdlm.distillation.methods``) and
rounds that halve the student's step count, each a share of the budget (a
``cdlm.distillation.rounds.RoundPlan``, advanced by the callbacks of
``cdlm.distillation.callbacks``, which the module contributes itself).

The teacher and the consistency EMA target are kept out of the module's children, so the
optimizer, the EMA callback and the exported model see the student alone; they are saved in
Lightning checkpoints by hand, so a resumed run continues its round with its teacher.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import lightning as L
import torch
from torch import nn

from cdlm.distillation.callbacks import EvaluateRounds, KeepRoundStudents, Rounds
from cdlm.distillation.rounds import RoundPlan, end_round
from cdlm.distillation.targets import halvings
from cdlm.training.ema import averaged_copy
from cdlm.training.module import ValidationMeans, validation_generator
from cdlm.training.optim import (
    OptimizerFactory,
    SchedulerFactory,
    check_label_dropout,
    clip_gradients,
    configure_optimization,
    training_labels,
    with_labels,
)
from cdlm.training.phases import budget_progress


class Distillation(L.LightningModule):
    """Distils ``teacher`` (a network of ``process``) into a few-step student.

    Args:
        process: the teacher's process (frozen; teacher and student share its embeddings).
        network: the student network, initialised from the teacher's weights.
        teacher: the teacher network (frozen, eval mode, never updated or exported).
        method: a ``cdlm.distillation.methods`` object.
        optimizer, lr_scheduler: partials, as for ``DiffusionLM``.
        start_steps: the teacher's step count in the first round (halving methods).
        end_steps: the student's step count after the last round.
        ema_decay: decay of the consistency target (``cdlm.training.ema.averaged_copy``).
        label_dropout: condition dropout for class-conditional networks.
        model_config: the teacher's model config; the student's adds a ``distillation`` record
            (method, round, steps, grid, sampler and, for block diffusion, its
            ``sampler_options``: the steps per block) that cdlm-sample and cdlm-eval default to.
        round_eval: called at the end of every round with (module, steps) -> dict of metrics to
            log (``cdlm.distillation.report.RoundEval``; ``callbacks.EvaluateRounds``), or None.
        round_dir: if set, each round's student is also written there as
            ``round<k>_<steps>steps.safetensors`` (``callbacks.KeepRoundStudents``).
        teacher_each_round: ``previous`` (round k's student teaches round k + 1, Salimans &
            Ho 2022) or ``original`` (the given teacher teaches every round, as in ELF).
        per_round: each round gets its own warmup-cosine LR schedule (replacing
            ``lr_scheduler``; ``round_warmup`` and ``round_min_lr`` of the peak), a fresh
            optimizer state and a restarted EMA, and starts from the previous round's EMA
            weights, which are also the round's student (saved, scored, and with
            ``teacher_each_round=previous`` the next teacher). Off: one schedule over all rounds
            and the raw weights passed on (the behaviour before, kept for its tables).
    """

    needs_teacher = True  # cdlm-train loads teacher=PATH and passes its network

    def __init__(
        self,
        process: nn.Module,
        network: nn.Module,
        teacher: nn.Module,
        method,
        optimizer: OptimizerFactory,
        lr_scheduler: SchedulerFactory | None = None,
        start_steps: int = 64,
        end_steps: int = 4,
        ema_decay: float = 0.99,
        label_dropout: float = 0.1,
        model_config: dict | None = None,
        round_eval: Callable | None = None,
        round_dir: str | None = None,
        teacher_each_round: str = "previous",
        per_round: bool = False,
        round_warmup: float = 0.1,
        round_min_lr: float = 0.1,
    ) -> None:
        super().__init__()
        if process.kind not in method.process_kinds:
            raise ValueError(
                f"{method.name} distillation applies to {', '.join(method.process_kinds)} "
                f"models; the teacher is {process.kind!r}"
            )
        if process.self_conditions:
            raise ValueError("distillation needs a teacher without self-conditioning")
        self.process, self.network, self.method = process, network, method
        self.process.requires_grad_(False)
        self.optimizer_factory, self.scheduler_factory = optimizer, lr_scheduler
        self.label_dropout = check_label_dropout(label_dropout)
        self.round_eval, self.round_dir = round_eval, round_dir
        self.rounds = RoundPlan(
            halvings(start_steps, end_steps) if method.halves else [end_steps],
            teacher_each_round,
            per_round,
            round_warmup,
            round_min_lr,
        )
        teacher = teacher.eval().requires_grad_(False)
        # Plain attributes through object.__setattr__: not children of this module.
        object.__setattr__(self, "teacher", teacher)
        target = averaged_copy(network, ema_decay) if method.uses_ema_target else None
        object.__setattr__(self, "ema_target", target)
        self.base_config = model_config or {}
        self.val_means = ValidationMeans()

    @property
    def counts(self) -> list[int]:
        """The student's step count in each round."""
        return self.rounds.counts

    @property
    def round(self) -> int:
        """The round in progress, 0-based."""
        return self.rounds.current

    @round.setter
    def round(self, index: int) -> None:
        self.rounds.current = index

    @property
    def steps(self) -> int:
        """The student's step count in the current round."""
        return self.rounds.steps

    def start_round(self, index: int) -> None:
        """Ends the current round and starts round ``index`` (``RoundPlan.advance``: the student
        handed on, the teacher chosen, EMA and optimizer restarted as configured)."""
        self.rounds.advance(self.trainer, self, self.teacher, self.network, index)

    def end_round(self) -> None:
        """Lets every ``RoundEnd`` callback act on the current round's student."""
        end_round(self.trainer, self)

    @property
    def model_config(self) -> dict:
        record = {
            "method": self.method.name,
            "round": self.round + 1,
            "rounds": len(self.counts),
            "steps": self.steps,
            "grid": "uniform",
            "sampler": self.method.sampler or self.process.default_sampler,
        }
        if self.process.block_size is not None:
            # blocks are denoised in turn, each in the student's steps (the block sampler would
            # otherwise share a run's steps out over the blocks)
            record["sampler_options"] = {"steps_per_block": self.steps}
        return self.base_config | {"distillation": record}

    def _denoisers(self, batch):
        # not children, so Lightning does not move them: follow the student (a no-op once there)
        for frozen in (self.teacher, self.ema_target):
            if frozen is not None:
                frozen.to(self.device)
        student = self.process.make_denoiser(self.network)
        teacher = self.process.make_denoiser(self.teacher)
        target = self.ema_target and self.process.make_denoiser(self.ema_target.module)
        labels = training_labels(self.network, batch, self.label_dropout)
        return tuple(with_labels(d, labels) for d in (student, teacher, target))

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        student, teacher, target = self._denoisers(batch)
        extra = {"target": target} if self.method.uses_ema_target else {}
        out = self.method.loss(self.process, student, teacher, batch, self.steps, **extra)
        self.log("train/loss", out.loss, prog_bar=True)
        self.log("round", float(self.round + 1), prog_bar=True)
        self.log_dict({f"train/{k}": v for k, v in out.metrics.items()})
        return out.loss

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        student, teacher, target = self._denoisers(batch)
        generator = validation_generator(self.trainer, batch_idx, batch["tokens"].device)
        extra = {"target": target} if self.method.uses_ema_target else {}
        out = self.method.loss(
            self.process, student, teacher, batch, self.steps, generator, **extra
        )
        self.val_means.update({"val/loss": out.loss}, len(batch["tokens"]))

    def on_validation_epoch_end(self) -> None:
        self.val_means.log(self)

    def configure_callbacks(self) -> list[L.Callback]:
        """The rounds (``cdlm.distillation.callbacks``): the module brings them, so that every
        trainer it is fitted by runs them, whatever its ``callbacks`` config."""
        callbacks: list[L.Callback] = [Rounds()]
        if self.round_dir:
            callbacks.append(KeepRoundStudents(self.round_dir))
        if self.round_eval is not None:
            callbacks.append(EvaluateRounds(self.round_eval))
        return callbacks

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        if self.ema_target is not None:
            self.ema_target.to(self.device)
            self.ema_target.update_parameters(self.network)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["distillation"] = {
            "round": self.round,
            "teacher": self.teacher.state_dict(),
            "ema_target": self.ema_target.state_dict() if self.ema_target else None,
        }

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        saved = checkpoint["distillation"]
        self.round = saved["round"]
        self.teacher.load_state_dict(saved["teacher"])
        if self.ema_target is not None and saved["ema_target"] is not None:
            self.ema_target.load_state_dict(saved["ema_target"])

    def round_lr_factor(self, step: int = 0) -> float:
        """The per-round LR factor at the trainer's progress (``RoundPlan.lr_factor``); off a
        trainer, the factor at the start."""
        try:
            trainer = self.trainer
        except RuntimeError:  # Lightning's public way to say the module is not attached
            return self.rounds.lr_factor(0.0)
        return self.rounds.lr_factor(budget_progress(trainer) or 0.0)

    def configure_gradient_clipping(
        self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None
    ) -> None:
        clip_gradients(self, optimizer, gradient_clip_val, gradient_clip_algorithm)

    def configure_optimizers(self):
        scheduler = self.scheduler_factory
        if self.rounds.per_round:

            def scheduler(optimizer):
                return torch.optim.lr_scheduler.LambdaLR(optimizer, self.round_lr_factor)

        return configure_optimization(
            self, self.network.parameters(), self.optimizer_factory, scheduler
        )


def student_of(teacher: nn.Module) -> nn.Module:
    """A trainable copy of the teacher network: the student starts from its weights."""
    return copy.deepcopy(teacher).train().requires_grad_(True)
