"""``cdlm-sample``: load a checkpoint, sample, print, and write JSONL atomically."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig

from cdlm.checkpoint import load_checkpoint
from cdlm.cli.common import require, run
from cdlm.generate import ROUNDINGS, generate
from cdlm.io import atomic_write_text
from cdlm.samplers.grids import GRIDS


def validate(cfg: DictConfig) -> None:
    require(cfg.ckpt is not None, "ckpt=PATH is required (a .safetensors file from cdlm-train)")
    require(cfg.steps >= 1, f"steps must be >= 1, got {cfg.steps}")
    require(cfg.num_samples >= 1, f"num_samples must be >= 1, got {cfg.num_samples}")
    require(cfg.seq_len is None or cfg.seq_len >= 1, f"seq_len must be >= 1, got {cfg.seq_len}")
    require(
        cfg.batch_size is None or cfg.batch_size >= 1,
        f"batch_size must be >= 1, got {cfg.batch_size}",
    )
    require(cfg.grid in GRIDS, f"unknown grid {cfg.grid!r}; valid: {', '.join(GRIDS)}")
    require(
        cfg.rounding in ROUNDINGS,
        f"unknown rounding {cfg.rounding!r}; valid: {', '.join(ROUNDINGS)}",
    )


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def sample(cfg: DictConfig) -> None:
    model = load_checkpoint(cfg.ckpt, resolve_device(cfg.device))
    sampler = instantiate(cfg.sampler)
    gen = generate(
        model.process,
        model.network,
        model.tokenizer,
        sampler,
        steps=cfg.steps,
        num_samples=cfg.num_samples,
        seq_len=cfg.seq_len or model.config["seq_len"],
        seed=cfg.seed,
        batch_size=cfg.batch_size,
        grid=cfg.grid,
        rounding=cfg.rounding,
        clamp=cfg.clamp,
    )
    name = sampler.func.sampler_name
    records = [
        {
            "index": i,
            "text": s.text,
            "token_ids": s.token_ids,
            "sampler": name,
            "steps": cfg.steps,
            "nfe": gen.nfe,
            "positions": gen.positions,
            "wall_seconds": round(gen.wall_seconds, 4),
            "seed": cfg.seed,
        }
        for i, s in enumerate(gen.samples)
    ]
    for r in records:
        print(f"[{r['index']}] {r['text']}\n")
    print(
        f"cdlm-sample: {len(records)} samples, sampler={name}, steps={cfg.steps}, "
        f"NFE={gen.nfe}, positions={gen.positions}, {gen.wall_seconds:.2f}s"
    )
    if cfg.out:
        atomic_write_text(Path(cfg.out), "".join(json.dumps(r) + "\n" for r in records))
        print(f"cdlm-sample: wrote {cfg.out}")


def main() -> None:
    run("cdlm-sample", "sample", sample, validate)


if __name__ == "__main__":
    main()
