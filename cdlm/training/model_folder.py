"""Makes a run folder a Hugging Face model folder at the end of training.

``ExportModel`` writes the run's one model file, ``model.safetensors``; this callback, listed
after it, writes the Hub companions beside it (``config.json``, the tokenizer files, the
``README.md`` model card; ``cdlm.hub``), so that the run folder itself is what
``cdlm-sample ckpt=FOLDER``, ``cdlm.from_pretrained(FOLDER)``, ``AutoTokenizer`` and
``cdlm.hub.push_folder`` take. The card records the recipe (the command's overrides), the
training tokens and wall time, and the val bound measured here on the final (EMA) weights;
``cdlm-eval ckpt=FOLDER`` adds gen-PPL.
"""

from __future__ import annotations

import time
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info

from cdlm.evaluation.bound import val_bits_per_token
from cdlm.hub import write_companions
from cdlm.model_file import Model
from cdlm.modes import eval_mode
from cdlm.training.resume import AtEnd, stop_if_terminated
from cdlm.training.scaling import batch_sizes, whole_model


def bound_facts(bound: dict, what: str) -> dict:
    """The card's fields for a val bound from ``val_bits_per_token``."""
    how = f"{bound['kind']} on {bound['sequences']} val sequences, {bound['draws']} draw(s); {what}"
    out = {"bits_per_token": bound["bits_per_token"], "bound_how": how}
    if "std_error" in bound:
        out["bits_per_token_std_error"] = bound["std_error"]
    return out


class ModelFolder(AtEnd):
    """At the end of training, writes the Hub companions into ``folder`` (the run folder).

    Args:
        folder: where ``ExportModel`` writes ``model.safetensors``.
        overrides: the command line's overrides (``${hydra:overrides.task}``), the recipe.
        bound_sequences: val sequences the final bound is measured on (0: not measured).
    """

    def __init__(
        self, folder: str, overrides: list[str] | None = None, bound_sequences: int = 256
    ) -> None:
        self.folder, self.overrides = Path(folder), list(overrides or [])
        self.bound_sequences, self.start = bound_sequences, time.perf_counter()

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_fit_start(trainer, pl_module)
        self.start = time.perf_counter()

    def training_facts(self, trainer: L.Trainer) -> dict:
        data = trainer.datamodule
        batch_tokens = batch_sizes(trainer, data.batch_size, data.seq_len)["batch/global_tokens"]
        return {
            "command": " ".join(["cdlm-train", *self.overrides]),
            "steps": trainer.global_step,
            "batch_tokens": batch_tokens,
            "tokens": trainer.global_step * batch_tokens,
            "wall_seconds": round(time.perf_counter() - self.start, 1),
        }

    def at_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        stop_if_terminated(trainer)
        process, network = whole_model(trainer, pl_module)  # every rank: a gather when sharded
        if process is None:
            return
        data = trainer.datamodule
        model = Model(process, network, data.tokenizer, pl_module.model_config)
        metrics = {}
        if self.bound_sequences > 0:
            tokens = data.val_set.tokens[: self.bound_sequences]
            # an eval-mode quantity (stratified t, no dropout)
            with eval_mode(process, network), torch.no_grad():
                bound = val_bits_per_token(model, tokens, seed=0)
            metrics = bound_facts(bound, f"at the end of training (step {trainer.global_step})")
            for logger in trainer.loggers:  # the one figure every process reports alike
                final = {"final/bits_per_token": bound["bits_per_token"]}
                logger.log_metrics(final, step=trainer.global_step)
            metrics["source"] = "cdlm-train (final weights)"
        facts = model.card_facts() | {"training": self.training_facts(trainer), "metrics": metrics}
        write_companions(self.folder, model.config, model.tokenizer, facts)
        rank_zero_info(
            f"model folder {self.folder} (config.json, tokenizer, README.md model card): "
            f"cdlm-sample ckpt={self.folder}"
        )
