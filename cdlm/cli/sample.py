"""``cdlm-sample``: load a checkpoint, sample (optionally class-conditional with guidance, from a
prompt, or infilling/editing a text), print, and write JSONL atomically."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import instantiate
from omegaconf import DictConfig, ListConfig
from tqdm import tqdm

from cdlm.checkpoint import Model, load_checkpoint
from cdlm.cli.common import UsageError, require, run
from cdlm.generate import ROUNDINGS, default_sampler, generate
from cdlm.guidance import Guidance
from cdlm.io import atomic_write_text
from cdlm.regions import Canvas, assemble, build_canvas, parse_template, prompt_template
from cdlm.samplers import check_compatible
from cdlm.samplers.grids import GRIDS


def scales(cfg: DictConfig) -> list[float]:
    """``guidance.scale`` as a list: one value or several (``guidance.scale=[0,1,2,4]``)."""
    value = cfg.guidance.scale
    return [float(v) for v in value] if isinstance(value, ListConfig) else [float(value)]


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
    require(cfg.temperature > 0, f"temperature must be > 0, got {cfg.temperature}")
    for w in scales(cfg):
        require(w >= 0, f"guidance.scale must be >= 0 (0: unconditional, 1: conditional), got {w}")
    inputs = [k for k in ("prompt", "infill", "edit") if cfg[k] is not None]
    require(len(inputs) <= 1, f"give at most one of prompt=, infill=, edit= (got {inputs})")
    require(
        0.0 < cfg.edit_strength <= 1.0, f"edit_strength must be in (0, 1], got {cfg.edit_strength}"
    )


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def label_index(model: Model, label: str | None) -> int | None:
    """The class index of ``label``; a clear error for unknown labels or unlabelled models."""
    if label is None:
        return None
    if getattr(model.network, "num_classes", 0) == 0:
        raise UsageError(f"label={label!r} given, but this model was trained without labels")
    names = model.config.get("labels", [])
    if str(label) not in names:
        raise UsageError(f"unknown label {label!r}; this model knows: {', '.join(names)}")
    return names.index(str(label))


def read_canvas(cfg: DictConfig, model: Model, seq_len: int) -> tuple[Canvas | None, float]:
    """The canvas of fixed and editable regions from prompt=/infill=/edit=, and the edit
    strength (1: editable spans start from noise)."""
    strength = cfg.edit_strength if cfg.edit is not None else 1.0
    if cfg.edit is not None and not Path(cfg.edit).is_file():
        raise UsageError(f"edit file not found: {cfg.edit}")
    tok = model.tokenizer
    fill = tok.mask_token_id if tok.mask_token_id is not None else tok.eos_token_id
    try:
        if cfg.prompt is not None:
            segments = prompt_template(str(cfg.prompt))
        elif cfg.infill is not None:
            segments = parse_template(str(cfg.infill))
        elif cfg.edit is not None:
            segments = parse_template(Path(cfg.edit).read_text(encoding="utf-8"))
        else:
            return None, 1.0
        return build_canvas(segments, tok, seq_len, fill), strength
    except ValueError as e:
        raise UsageError(str(e)) from None


def output_path(out: str | None) -> Path | None:
    """``out`` as given; in a multirun each job writes into its own sweep folder (default
    ``samples.jsonl`` there), so a sweep keeps one file per setting."""
    hydra = HydraConfig.get()
    if hydra.mode == RunMode.MULTIRUN:
        path = Path(out or "samples.jsonl")
        return path if path.is_absolute() else Path(hydra.runtime.output_dir) / path
    return Path(out) if out else None


def sample(cfg: DictConfig) -> None:
    model = load_checkpoint(cfg.ckpt, resolve_device(cfg.device))
    sampler = instantiate(cfg.sampler) if cfg.get("sampler") else default_sampler(model.process)
    seq_len = cfg.seq_len or model.config["seq_len"]
    label = label_index(model, cfg.label)
    canvas, strength = read_canvas(cfg, model, seq_len)
    check_compatible(sampler, model.process.kind)
    name = sampler.func.sampler_name
    batches = -(-cfg.num_samples // (cfg.batch_size or cfg.num_samples))
    per_batch = seq_len if model.process.kind == "autoregressive" else cfg.steps
    records = []
    for w in scales(cfg):
        with tqdm(
            total=batches * per_batch,
            desc=f"scale {w:g}" if label is not None else "sampling",
            disable=not cfg.progress,
            file=sys.stderr,
            leave=False,
        ) as bar:
            gen = generate(
                model.process,
                model.network,
                model.tokenizer,
                sampler,
                steps=cfg.steps,
                num_samples=cfg.num_samples,
                seq_len=seq_len,
                seed=cfg.seed,
                batch_size=cfg.batch_size,
                grid=cfg.grid,
                rounding=cfg.rounding,
                clamp=cfg.clamp,
                temperature=cfg.temperature,
                cut_at_eos=canvas is None,
                callback=lambda info: bar.update(1),
                guidance=Guidance(label, w),
                canvas=canvas,
                strength=strength,
            )
        for s in gen.samples:
            record = {"index": len(records), "text": s.text, "token_ids": s.token_ids}
            if canvas is not None:
                text, regions = assemble(canvas, s.token_ids, model.tokenizer)
                record |= {"text": text, "regions": [r.as_dict() for r in regions]}
            records.append(
                record
                | {
                    "label": cfg.label,
                    "scale": w if label is not None else None,
                    "sampler": name,
                    "steps": cfg.steps,
                    "nfe": gen.nfe,
                    "positions": gen.positions,
                    "wall_seconds": round(gen.wall_seconds, 4),
                    "seed": cfg.seed,
                }
            )
            scale_note = f" (label {cfg.label}, scale {w:g})" if label is not None else ""
            print(f"[{record['index']}]{scale_note} {record['text']}\n")
        print(
            f"cdlm-sample: {len(gen.samples)} samples, sampler={name}, steps={cfg.steps}, "
            f"NFE={gen.nfe}, positions={gen.positions}, {gen.wall_seconds:.2f}s"
        )
    path = output_path(cfg.out)
    if path is not None:
        atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in records))
        print(f"cdlm-sample: wrote {path}")


def main() -> None:
    run("cdlm-sample", "sample", sample, validate)


if __name__ == "__main__":
    main()
