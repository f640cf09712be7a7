"""``cdlm-sample``: load a model (file, folder, Hub id), sample (guided on a label and/or prompt;
from a prompt; infilling/editing; a file of different prompts, ``prompts=``), print, write JSONL
atomically, show/save the canvas."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import instantiate
from omegaconf import DictConfig, ListConfig

from cdlm import config_dir
from cdlm.canvas import FORMATS, save
from cdlm.cli.common import model_options, resolve_device, run, validate_model_and_output
from cdlm.generation import ROUNDINGS, Plan, choose, with_cache
from cdlm.generation.inputs import label_index, read_layout, read_rows
from cdlm.generation.records import headline, row_records
from cdlm.generation.rows import generate_rows
from cdlm.generation.session import View, sample_scales
from cdlm.guidance import GUIDE_ON, Guidance
from cdlm.io import atomic_write_text
from cdlm.model_file import Model, load_model
from cdlm.regions import Layout
from cdlm.samplers.grids import GRIDS
from cdlm.validation import (
    COUNT,
    FLAG,
    OPTIONAL_COUNT,
    POSITIVE,
    SCALE,
    SEED,
    Choice,
    Number,
    UsageError,
    check,
    require,
)


def scales(cfg: DictConfig) -> list[float]:
    """``guidance.scale`` as a list: one value or several (``guidance.scale=[0,1,2,4]``)."""
    value = cfg.guidance.scale
    return [float(v) for v in value] if isinstance(value, ListConfig) else [float(value)]


RULES = {
    "steps": OPTIONAL_COUNT,
    "num_samples": COUNT,
    "seq_len": Number(
        integer=True, at_least=1, nullable=True, note="(or null: the training length)"
    ),
    "batch_size": Number(integer=True, at_least=1, nullable=True, note="(or null: one batch)"),
    "seed": SEED,
    "grid": Choice(GRIDS),
    "rounding": Choice(ROUNDINGS),
    "clamp": FLAG,
    "progress": FLAG,
    "temperature": POSITIVE,
    "self_cond_scale": Number(at_least=0),
    "max_new_tokens": OPTIONAL_COUNT,
    "guidance.on": Choice(GUIDE_ON),
    "show": Choice(("none", "canvas")),
    "edit_strength": Number(above=0, at_most=1),
}


def validate(cfg: DictConfig, overrides: list[str] | None = None) -> None:
    """Every option's type and range, before any work; ``overrides`` is not needed here."""
    check(cfg, RULES)
    raw = cfg.guidance.scale
    for w in raw if isinstance(raw, ListConfig) else [raw]:
        SCALE.check("guidance.scale", w)
    if cfg.prompts is not None:
        given = [k for k in ("prompt", "infill", "edit", "max_new_tokens", "label", "canvas")]
        given = [k for k in given if cfg[k] is not None]
        require(not given, f"prompts= carries its own rows; drop {', '.join(given)}")
        require(cfg.show == "none", "prompts= has no live canvas (show=none)")
    inputs = [k for k in ("prompt", "infill", "edit") if cfg[k] is not None]
    require(len(inputs) <= 1, f"give at most one of prompt=, infill=, edit= (got {inputs})")
    fixed_text = bool(inputs) or cfg.prompts is not None
    if cfg.max_new_tokens is not None:
        require(cfg.prompt is not None, "max_new_tokens= counts the tokens after prompt=; give one")
        require(
            cfg.seq_len is None,
            "give seq_len= (the whole canvas) or max_new_tokens= (after the prompt), not both",
        )
    require(
        cfg.label is not None or fixed_text or all(w == 1.0 for w in scales(cfg)),
        "guidance.scale needs something to guide on: label=NAME (a class-conditional model) or "
        f"fixed text (prompt=, infill=, edit=, prompts=); without either it would be ignored "
        f"(got {raw})",
    )
    try:
        Guidance(cfg.label, 1.0, cfg.guidance.on).targets(fixed_text)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if cfg.canvas is not None:
        suffix = Path(str(cfg.canvas)).suffix
        require(suffix in FORMATS, f"canvas={cfg.canvas}: valid formats: {', '.join(FORMATS)}")
    validate_model_and_output(cfg)


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


def layout_of(cfg: DictConfig, model: Model, seq_len: int) -> Layout | None:
    """The layout of ``prompt=``, ``infill=`` or ``edit=FILE`` (None without any), at most
    ``seq_len`` positions; a ``UsageError`` naming a missing file or a bad template."""
    if cfg.edit is not None and not Path(cfg.edit).is_file():
        raise UsageError(f"edit file not found: {cfg.edit}")
    try:
        return read_layout(
            model,
            seq_len,
            prompt=None if cfg.prompt is None else str(cfg.prompt),
            infill=None if cfg.infill is None else str(cfg.infill),
            edit=None if cfg.edit is None else Path(cfg.edit).read_text(encoding="utf-8"),
            max_new_tokens=cfg.max_new_tokens,
        )
    except ValueError as e:
        raise UsageError(str(e)) from None


def plan_of(cfg: DictConfig, choice, seq_len: int, **fixed) -> Plan:
    """The plan the config asks for; ``fixed``: the layout fields of fixed text."""
    denoising = {k: cfg[k] for k in ("temperature", "clamp", "self_cond_scale")}
    options = {k: cfg[k] for k in ("num_samples", "seed", "batch_size", "grid", "rounding")}
    return Plan(seq_len=seq_len, steps=choice.steps, denoising=denoising, **options, **fixed)


def sample_rows(cfg: DictConfig, model: Model, sampler, choice, seq_len: int) -> list[dict]:
    """``prompts=FILE``: every line's row, in batches of ``batch_size`` rows, at each guidance
    scale (on the rows' fixed text, each row with the same seed at every scale); its records."""
    path = Path(str(cfg.prompts))
    if not path.is_file():
        raise UsageError(f"prompts file not found: {path}")
    rows = read_rows(path.read_text(encoding="utf-8"))
    plan = plan_of(cfg, choice, seq_len)
    kept: list[dict] = []
    on = Guidance(None, 1.0, cfg.guidance.on).guided_on(True, scales(cfg))
    for w in scales(cfg):
        run_plan = replace(plan, guidance=Guidance(None, w, cfg.guidance.on))
        gen = generate_rows(model, sampler, run_plan, rows, what="line")
        scale = w if on else None
        drawn = row_records(gen, choice.name, plan.steps, cfg.num_samples, scale, on, len(kept))
        what = f", prompt guidance, scale {w:g}" if on else ""
        for record in drawn:
            print(f"[{record['index']}] (line {record['line']}{what}) {record['text']}\n")
        print(
            f"cdlm-sample: {len(drawn)} rows, sampler={choice.name}, steps={plan.steps}, "
            f"NFE={gen.nfe}, positions={gen.positions}, {gen.wall_seconds:.2f}s"
        )
        kept += drawn
    return kept


def sample(cfg: DictConfig) -> None:
    """Reads the config into a plan, draws it at every scale, prints and writes the records."""
    model = load_model(cfg.ckpt, resolve_device(cfg.device), **model_options(cfg))
    chosen = instantiate(cfg.sampler) if cfg.get("sampler") else None
    choice = choose(model.process, model.config, cfg.steps, chosen)
    if choice.note:
        print(f"cdlm-sample: {choice.note}", file=sys.stderr)
    seq_len = cfg.seq_len or model.config["seq_len"]
    sampler = choice.sampler
    if "cache" in cfg:  # cache=prefix|dual|none chosen (conf/cache/; none: null)
        sampler = with_cache(sampler, instantiate(cfg.cache))
    if cfg.prompts is not None:
        write(cfg, sample_rows(cfg, model, sampler, choice, seq_len))
        return
    layout = layout_of(cfg, model, seq_len)
    strength = cfg.edit_strength if cfg.edit is not None else 1.0
    seq_len = len(layout.ids) if layout is not None else seq_len
    plan = plan_of(
        cfg, choice, seq_len, layout=layout, strength=strength, cut_at_eos=layout is None
    )
    label = None if cfg.label is None else (label_index(model, cfg.label), str(cfg.label))
    view = View(cfg.progress, live=cfg.show == "canvas", record=cfg.canvas is not None)
    kept = []
    for drawn in sample_scales(model, sampler, plan, scales(cfg), label, cfg.guidance.on, view):
        for record in drawn.records:
            print(f"{headline(record)}\n")
        gen = drawn.generation
        print(
            f"cdlm-sample: {len(gen.samples)} samples, sampler={choice.name}, steps={plan.steps}, "
            f"NFE={gen.nfe}, positions={gen.positions}, {gen.wall_seconds:.2f}s"
            + "".join(f", {key}={value:.3g}" for key, value in gen.stats.items())
        )
        if cfg.canvas is not None:
            path = canvas_path(Path(str(cfg.canvas)), drawn.scale, len(scales(cfg)))
            meta = f"{cfg.ckpt} · {model.process.kind} · sampler {choice.name} · {plan.steps} steps"
            guided = drawn.records[0]["scale"] is not None
            title = (
                f"cdlm denoising canvas (scale {drawn.scale:g})"
                if guided
                else "cdlm denoising canvas"
            )
            save(path, drawn.recorder, model.tokenizer, title, meta)
            print(f"cdlm-sample: wrote the canvas of every step to {path}")
        kept += drawn.records
    write(cfg, kept)


def write(cfg: DictConfig, kept: list[dict]) -> None:
    """The records as JSONL to ``out=`` (if given), atomically."""
    path = output_path(cfg.out)
    if path is not None:
        atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in kept))
        print(f"cdlm-sample: wrote {path}")


def main() -> None:
    if any(a in ("--help", "-h") for a in sys.argv[1:]):
        options = (config_dir() / "sample.yaml").read_text(encoding="utf-8").split("\nhydra:")[0]
        print(f"{__doc__}\n\nOptions (key=value), from conf/sample.yaml:\n\n{options}")
        return
    run("cdlm-sample", "sample", sample, validate)


if __name__ == "__main__":
    main()
