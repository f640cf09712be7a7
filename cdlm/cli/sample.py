"""``cdlm-sample``: load a model (file, folder or Hub id), sample (optionally class-conditional
with guidance on the label and/or the prompt, from a prompt, or infilling/editing a text), print,
write JSONL atomically, and show or save the denoising canvas (``show=canvas``, ``canvas=``)."""

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

from cdlm import config_dir
from cdlm.canvas import FORMATS, LiveCanvas, Recorder, save
from cdlm.cli.common import (
    UsageError,
    require,
    require_bool,
    require_choice,
    require_model_file,
    require_number,
    require_output_file,
    run,
)
from cdlm.generate import ROUNDINGS, generate, sampling_defaults
from cdlm.guidance import GUIDE_ON, Guidance
from cdlm.io import atomic_write_text
from cdlm.model_file import Model, load_model
from cdlm.regions import Layout, assemble, build_layout, parse_template, prompt_template
from cdlm.samplers import check_compatible
from cdlm.samplers.blockwise import with_cache
from cdlm.samplers.grids import GRIDS


def scales(cfg: DictConfig) -> list[float]:
    """``guidance.scale`` as a list: one value or several (``guidance.scale=[0,1,2,4]``)."""
    value = cfg.guidance.scale
    return [float(v) for v in value] if isinstance(value, ListConfig) else [float(value)]


def validate(cfg: DictConfig, overrides: list[str] | None = None) -> None:
    """Every option's type and range, before any work; ``overrides`` is not needed here."""
    require(
        cfg.ckpt is not None,
        "ckpt=PATH is required (a cdlm-train run folder, a model folder, its model.safetensors, "
        "or a Hugging Face Hub id)",
    )
    require_number("steps", cfg.steps, integer=True, at_least=1, nullable=True)
    require_number("num_samples", cfg.num_samples, integer=True, at_least=1)
    for key, null in (("seq_len", "the training length"), ("batch_size", "one batch")):
        note = f"(or null: {null})"
        require_number(key, cfg[key], integer=True, at_least=1, nullable=True, note=note)
    require_number("seed", cfg.seed, integer=True)
    require_choice("grid", cfg.grid, GRIDS)
    require_choice("rounding", cfg.rounding, ROUNDINGS)
    require_bool("clamp", cfg.clamp)
    require_bool("progress", cfg.progress)
    require_number("temperature", cfg.temperature, above=0)
    raw = cfg.guidance.scale
    for w in raw if isinstance(raw, ListConfig) else [raw]:
        require_number("guidance.scale", w, at_least=0, note="(0: unconditional, 1: conditional)")
    inputs = [k for k in ("prompt", "infill", "edit") if cfg[k] is not None]
    require(len(inputs) <= 1, f"give at most one of prompt=, infill=, edit= (got {inputs})")
    require_number("max_new_tokens", cfg.max_new_tokens, integer=True, at_least=1, nullable=True)
    if cfg.max_new_tokens is not None:
        require(cfg.prompt is not None, "max_new_tokens= counts the tokens after prompt=; give one")
        require(
            cfg.seq_len is None,
            "give seq_len= (the whole canvas) or max_new_tokens= (after the prompt), not both",
        )
    require_choice("guidance.on", cfg.guidance.on, GUIDE_ON)
    require(
        cfg.label is not None or inputs or all(w == 1.0 for w in scales(cfg)),
        "guidance.scale needs something to guide on: label=NAME (a class-conditional model) or "
        f"fixed text (prompt=, infill=, edit=); without either it would be ignored (got {raw})",
    )
    try:
        Guidance(cfg.label, 1.0, cfg.guidance.on).targets(bool(inputs))
    except ValueError as e:
        raise UsageError(str(e)) from None
    require_choice("show", cfg.show, ("none", "canvas"))
    if cfg.canvas is not None:
        suffix = Path(str(cfg.canvas)).suffix
        require(suffix in FORMATS, f"canvas={cfg.canvas}: valid formats: {', '.join(FORMATS)}")
    require_number("edit_strength", cfg.edit_strength, above=0, at_most=1)
    require_output_file("out", cfg.out)
    resolve_device(cfg.device)
    require_model_file(cfg.ckpt)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(name)
    except (RuntimeError, TypeError):
        raise UsageError(
            f"unknown device {name!r}; valid: auto, cpu, cuda, cuda:N (or any torch device)"
        ) from None


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


def read_canvas(cfg: DictConfig, model: Model, seq_len: int) -> tuple[Layout | None, float]:
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
        canvas = build_layout(segments, tok, seq_len, fill)
        if cfg.max_new_tokens is not None:  # the prompt, then that many tokens to generate
            prompt = sum(not e for e in canvas.editable)
            total = prompt + cfg.max_new_tokens
            if total > model.config["seq_len"]:
                raise ValueError(
                    f"the prompt ({prompt} tokens) and max_new_tokens={cfg.max_new_tokens} "
                    f"make {total} positions, more than the model's {model.config['seq_len']} "
                    "(its training length)"
                )
            canvas = build_layout(segments, tok, total, fill)
        return canvas, strength
    except ValueError as e:
        raise UsageError(str(e)) from None


def watcher(
    cfg: DictConfig, model: Model, canvas: Layout | None, guidance: Guidance, steps: int
) -> Recorder | None:
    """The step recorder behind ``show=canvas`` and ``canvas=PATH`` (None without either)."""
    if cfg.show == "none" and cfg.canvas is None:
        return None
    prompted = canvas is not None and not all(canvas.editable)
    fixed = torch.tensor([not e for e in canvas.editable]) if canvas is not None else None
    live = LiveCanvas(model.tokenizer, fixed=fixed, steps=steps) if cfg.show == "canvas" else None
    return Recorder(model.process, fixed, guidance.passes(prompted), on_frame=live)


def guidance_on(guidance: Guidance, canvas: Layout | None) -> str:
    """What a guided record was guided on: label, prompt or both."""
    use_label, use_prompt = guidance.targets(canvas is not None and not all(canvas.editable))
    return "both" if use_label and use_prompt else "label" if use_label else "prompt"


def canvas_path(path: Path, w: float, n_scales: int) -> Path:
    """``canvas=out.html`` as given; with several scales, one file per scale (out-w2.html)."""
    return path if n_scales == 1 else path.with_name(f"{path.stem}-w{w:g}{path.suffix}")


def output_path(out: str | None) -> Path | None:
    """``out`` as given; in a multirun each job writes into its own sweep folder (default
    ``samples.jsonl`` there), so a sweep keeps one file per setting."""
    hydra = HydraConfig.get()
    if hydra.mode == RunMode.MULTIRUN:
        path = Path(out or "samples.jsonl")
        return path if path.is_absolute() else Path(hydra.runtime.output_dir) / path
    return Path(out) if out else None


def sample(cfg: DictConfig) -> None:
    model = load_model(cfg.ckpt, resolve_device(cfg.device))
    steps, sampler, note = sampling_defaults(
        model.process,
        model.config,
        cfg.steps,
        instantiate(cfg.sampler) if cfg.get("sampler") else None,
    )
    if note:
        print(f"cdlm-sample: {note}", file=sys.stderr)
    seq_len = cfg.seq_len or model.config["seq_len"]
    label = label_index(model, cfg.label)
    canvas, strength = read_canvas(cfg, model, seq_len)
    seq_len = len(canvas.ids) if canvas is not None else seq_len  # max_new_tokens= sets it
    check_compatible(sampler, model.process.kind)
    sampler = with_cache(sampler, cfg.cache)
    name = sampler.func.sampler_name
    batches = -(-cfg.num_samples // (cfg.batch_size or cfg.num_samples))
    per_batch = seq_len if model.process.sequential else steps  # callbacks per batch
    prompted = canvas is not None and not all(canvas.editable)
    on_prompt = cfg.guidance.on in ("prompt", "both") or (
        cfg.guidance.on == "auto" and label is None and any(w != 1.0 for w in scales(cfg))
    )
    guided = label is not None or (prompted and on_prompt)
    records = []
    for w in scales(cfg):
        guidance = Guidance(label, w, cfg.guidance.on)
        recorder = watcher(cfg, model, canvas, guidance, per_batch)
        with tqdm(
            total=batches * per_batch,
            desc=f"scale {w:g}" if guided else "sampling",
            disable=None if cfg.progress and cfg.show == "none" else True,  # None: on a tty
            file=sys.stderr,
            leave=False,
        ) as bar:

            def step(info, bar=bar, recorder=recorder) -> None:
                bar.update(1)
                if recorder is not None:
                    recorder(info)

            gen = generate(
                model.process,
                model.network,
                model.tokenizer,
                sampler,
                steps=steps,
                num_samples=cfg.num_samples,
                seq_len=seq_len,
                seed=cfg.seed,
                batch_size=cfg.batch_size,
                grid=cfg.grid,
                rounding=cfg.rounding,
                clamp=cfg.clamp,
                temperature=cfg.temperature,
                cut_at_eos=canvas is None,
                callback=step,
                guidance=guidance,
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
                    "scale": w if guided else None,
                    "guidance_on": guidance_on(guidance, canvas) if guided else None,
                    "sampler": name,
                    "steps": steps,
                    "nfe": gen.nfe,
                    "positions": gen.positions,
                    "wall_seconds": round(gen.wall_seconds, 4),
                    "seed": cfg.seed,
                }
            )
            on = records[-1]["guidance_on"]
            what = {"label": f"label {cfg.label}", "prompt": "prompt guidance"}.get(
                on, f"label {cfg.label} and prompt"
            )
            scale_note = f" ({what}, scale {w:g})" if guided else ""
            print(f"[{record['index']}]{scale_note} {record['text']}\n")
        print(
            f"cdlm-sample: {len(gen.samples)} samples, sampler={name}, steps={steps}, "
            f"NFE={gen.nfe}, positions={gen.positions}, {gen.wall_seconds:.2f}s"
        )
        if cfg.canvas is not None:
            path = canvas_path(Path(str(cfg.canvas)), w, len(scales(cfg)))
            meta = f"{cfg.ckpt} · {model.process.kind} · sampler {name} · {steps} steps"
            title = f"cdlm denoising canvas (scale {w:g})" if guided else "cdlm denoising canvas"
            save(path, recorder, model.tokenizer, title, meta)
            print(f"cdlm-sample: wrote the canvas of every step to {path}")
    path = output_path(cfg.out)
    if path is not None:
        atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in records))
        print(f"cdlm-sample: wrote {path}")


def main() -> None:
    if any(a in ("--help", "-h") for a in sys.argv[1:]):
        options = (config_dir() / "sample.yaml").read_text(encoding="utf-8").split("\nhydra:")[0]
        print(f"{__doc__}\n\nOptions (key=value), from conf/sample.yaml:\n\n{options}")
        return
    run("cdlm-sample", "sample", sample, validate)


if __name__ == "__main__":
    main()
