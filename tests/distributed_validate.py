"""Validates a cdlm model on ``DEVICES`` CPU processes (Lightning's DDP, gloo) and writes the
logged figures as JSON: run by tests/test_distributed.py, once on 1 process and once on 2.

    python tests/distributed_validate.py MODEL CORPUS TOKENIZER_FROM_MODEL DEVICES BATCH OUT

Lightning's DDP launcher starts rank 1 by running this same command again.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import lightning as L
import torch

from cdlm.data import TextDataModule
from cdlm.model_file import load_model
from cdlm.training.module import DiffusionLM


def main() -> None:
    model_path, corpus, devices, batch, out = sys.argv[1:6]
    torch.set_num_threads(1)
    model = load_model(model_path)
    data = TextDataModule(path=corpus, seq_len=model.config["seq_len"], batch_size=int(batch))
    data.use_tokenizer(model.tokenizer)
    data.setup("validate")
    module = DiffusionLM(model.process, model.network, optimizer=None, log_prior=data.log_unigram())
    trainer = L.Trainer(
        accelerator="cpu",
        devices=int(devices),
        strategy="ddp" if int(devices) > 1 else "auto",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        limit_val_batches=1.0,
    )
    trainer.validate(module, datamodule=data, verbose=False)
    if trainer.is_global_zero:
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
        Path(out).write_text(json.dumps(metrics, indent=2))


if __name__ == "__main__":
    main()
