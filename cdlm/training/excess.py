"""Exact excess during training: a world run (``data=world:<name>``) scores its bound beside its
world's oracle at every validation (``cdlm.evaluation.excess``), so that learning is measured
against the floor the process itself could reach, not against a loss of unknown floor."""

from __future__ import annotations

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_warn

from cdlm import worlds
from cdlm.evaluation.excess import GroupBits, group_bits, paired_bound
from cdlm.model_file import Model, ModelFileError, oracle_model
from cdlm.modes import eval_mode
from cdlm.training.resume import stop_if_terminated
from cdlm.training.scaling import whole_model


class WorldExcess(L.Callback):
    """At each validation of a fit (not the sanity check) logs, on the first ``sequences`` of the
    world's fixed validation sequences: ``val/bound_bits`` (the model's bound: exact NLL for AR,
    the ELBO otherwise, the VDM ELBO for gaussian), ``val/oracle_bits`` (the same process on the
    world's exact posterior, same sequences and draws), ``val/excess_bits`` (their difference)
    and ``val/excess_se`` (its standard error over groups of ``group_size`` sequences).

    It scores the weights the other validation callbacks see (the EMA's, when ``callbacks.ema`` is
    listed before it). The oracle's figures are computed once and reused, except where the oracle
    reads the model's own embedding table (a continuous process), which training moves. Every
    process's oracle bound is the world's NLL in expectation (the uniform one through its
    leave-one-out oracle), so the excess is the model's own.

    Args:
        world: ``world:<name>``, the run's data (``${oc.select:data.world,null}``); None: off.
        sequences: validation sequences scored (at most the data's ``val_size``).
        draws: noise draws of a diffusion bound per sequence (an exact likelihood takes one).
        group_size: sequences per batch, the unit of the standard error.
        seed: the draws' evaluation seed: the same draws at every validation.
    """

    def __init__(
        self,
        world: str | None,
        sequences: int = 256,
        draws: int = 4,
        group_size: int = 16,
        seed: int = 0,
    ) -> None:
        for key, value in (("sequences", sequences), ("draws", draws), ("group_size", group_size)):
            if not (isinstance(value, int) and value >= 1):
                raise ValueError(f"callbacks.excess.{key} must be an integer >= 1, got {value!r}")
        self.world = world
        self.sequences, self.draws, self.group_size, self.seed = sequences, draws, group_size, seed
        self.cached: GroupBits | None = None  # the oracle's, where it does not read the model

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.world is None or trainer.sanity_checking or trainer.state.fn != "fit":
            return
        stop_if_terminated(trainer)
        process, network = whole_model(trainer, pl_module)  # every rank: a gather when sharded
        if process is None:
            return
        data = trainer.datamodule
        model = Model(process, network, data.tokenizer, pl_module.model_config)
        tokens = data.val_set.tokens[: self.sequences]
        options = {"seed": self.seed, "draws": self.draws, "group_size": self.group_size}
        with eval_mode(process, network), torch.no_grad():
            oracle = self._oracle(model, tokens, pl_module.device, options)
            if oracle is None:
                return
            found = paired_bound(group_bits(model, tokens, **options), oracle)
        pl_module.log_dict(
            {
                "val/bound_bits": found.bound_bits,
                "val/oracle_bits": found.oracle_bits,
                "val/excess_bits": found.excess_bits,
                "val/excess_se": found.excess_se,
            },
            rank_zero_only=True,
        )

    def _oracle(self, model: Model, tokens, device, options: dict) -> GroupBits | None:
        """The oracle's group bounds (cached unless it reads the model); None, with one warning,
        where this process has no oracle."""
        if self.cached is not None:
            return self.cached
        world = worlds.load(self.world)
        if world.length != tokens.shape[1]:  # the oracle's world at the data's length
            world = worlds.load(self.world, length=tokens.shape[1])
        reads_model = model.process.continuous  # its oracle diffuses over the model's table
        try:
            oracle = oracle_model(
                world, model.config["process"], device, embedding=model if reads_model else None
            )
        except (ModelFileError, ValueError) as e:
            rank_zero_warn(f"callbacks.excess: no oracle for this process ({e}); excess not logged")
            self.world = None
            return None
        bits = group_bits(oracle, tokens, **options)
        if not reads_model:
            self.cached = bits
        return bits
