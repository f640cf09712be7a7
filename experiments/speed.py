"""Decoding speed beside quality, one run: KV-cached AR against block diffusion with its KV cache
(its guards, self-speculative decoding and SDTT students) and the full-attention masked model
with no, prefix and dual cache.

    python experiments/speed.py --ar A.safetensors --block B4.safetensors --masked M.safetensors \
        [--sdtt S4=S.safetensors] --out docs/results/speed

Every row: tokens/s on new tokens (min/median/max over timed runs after a warm-up), NFE,
positions processed, the row's own peak memory, time to the first token and to the first stable
token, gen-PPL beside entropy (no-prompt rows; the prompt rows time the same decoding after a
prompt), the share its guard committed (guarded rows), the tokens accepted per call (speculative
rows) and the model's bound. Writes ``<out>.json``/``.md``; ``scripts/frontier.py`` draws gen-PPL
against tokens/s from it or from any ``cdlm-eval`` reports.
"""

from __future__ import annotations

import argparse
import functools
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from speed_report import markdown  # experiments/, the script's folder

from cdlm.evaluation.bound import val_bits_per_token
from cdlm.evaluation.guard_share import EntropyGuard, Guard, GuardedBlocks, ThresholdGuard
from cdlm.evaluation.harness import text_quality
from cdlm.evaluation.quality import load_scorer
from cdlm.evaluation.speed import measure
from cdlm.generation import Plan, decode, named_sampler
from cdlm.io import atomic_write_text
from cdlm.likelihood.evaluate import validation_tokens
from cdlm.model_file import load_model
from cdlm.regions import build_layout, prompt_template
from cdlm.samplers import SAMPLERS
from cdlm.samplers.masked_steps import blocks_of
from cdlm.samplers.speculative import sample_speculative

THRESHOLD = "cdlm.samplers.rules.Threshold"
ENTROPY_BOUNDED = "cdlm.samplers.rules.EntropyBounded"
GUARDS = {THRESHOLD: ThresholdGuard, ENTROPY_BOUNDED: EntropyGuard}
# A cap on the guarded rows' steps per block, not a cost: each step commits at least one token
# and a decided block stops, so a block of 4 takes at most 4 network passes whatever the cap.
GUARD_STEPS = 16
SPECULATIVE = (("speculative greedy", 0.0), ("speculative, T=1", 1.0))


@dataclass(frozen=True)
class Row:
    """One row of the table: its model (``key``), sampler config and options, the temperature
    it samples at (AR's at the same one is its yardstick) and the plan's ``steps``, or
    ``block_steps``: steps for each block of the canvas (a masked sampler shares its steps over
    every block, a prompt's decided ones too, so a prompt row gets more steps in all and as many
    per generated block as its no-prompt row). ``guard``: the row's guard, its blocks of
    ``block_length`` (None: the block model's own). ``verifier``: speculative rows verified by
    that (AR) model instead of the block model's own causal pass."""

    name: str
    key: str
    sampler: str
    options: dict = field(default_factory=dict)
    temperature: float = 1.0
    steps: int = 1
    block_steps: int | None = None
    guard: Guard | None = None
    block_length: int | None = None
    verifier: str | None = None  # a model key whose next-token predictor verifies the drafts

    def plan_steps(self, canvas_length: int) -> int:
        if self.block_steps is None:
            return self.steps
        return self.block_steps * len(blocks_of(canvas_length, self.block_length))


def block_rows(key: str, steps: tuple[int, ...]) -> list[Row]:
    return [
        Row(f"{key}, {k} step(s)/block, cache", key, "block", {"steps_per_block": k}) for k in steps
    ]


def guard_rows(key: str) -> list[Row]:
    """Fast-dLLM's setting (greedy proposals, T = 0) and the same guards over sampled proposals
    (T = 1), which keep AR-like entropy where greedy decoding collapses."""
    guards = [
        ("threshold", THRESHOLD, "threshold", 0.9, 0.0),
        ("threshold", THRESHOLD, "threshold", 0.9, 1.0),
        ("threshold", THRESHOLD, "threshold", 0.7, 1.0),
        ("entropy-bounded", ENTROPY_BOUNDED, "gamma", 2.0, 1.0),
    ]
    rows = []
    for label, target, option, value, temperature in guards:
        rule = {"_target_": target, option: value, "temperature": temperature}
        options = {"rule": rule, "steps_per_block": GUARD_STEPS}
        name = f"{key}, {label} {value}, T={temperature:g}, cache"
        rows.append(Row(name, key, "block", options, temperature, guard=GUARDS[target](value)))
    return rows


def speculative_rows(key: str) -> list[Row]:
    """Self-speculative decoding: greedy (the longest draft prefix the causal pass's argmax
    agrees with) and speculative sampling (the causal pass's distribution exactly)."""
    rows = [
        Row(f"{key}, {label}", key, "speculative", {"temperature": t}, t)
        for label, t in SPECULATIVE
    ]
    # the alternative the issue asks to measure: verification by the AR checkpoint the block
    # model started from (one more call per draft) instead of its own causal clean stream
    rows.append(
        Row(
            f"{key}, speculative greedy, AR verifier",
            key,
            "speculative",
            {"temperature": 0.0},
            0.0,
            verifier="ar",
        )
    )
    return rows


def masked_rows(args) -> list[Row]:
    """Threshold 0.9 over blocks of ``--masked-block``, ``--masked-steps-per-block`` each (at
    most: each step commits at least one token and a decided block stops)."""
    rows = []
    for cache, temperature in (("none", 0.0), ("prefix", 0.0), ("dual", 0.0), ("dual", 1.0)):
        # conf/cache/<name>.yaml's object (none: no cache)
        obj = {"_target_": f"cdlm.samplers.blockwise.{cache.title()}Cache"}
        options = {
            "block_length": args.masked_block,
            "cache": obj if cache != "none" else None,
            "rule": {"temperature": temperature},
        }
        rows.append(
            Row(
                f"masked, blocks of {args.masked_block}, threshold 0.9, T={temperature:g}, "
                f"cache={cache}",
                "masked",
                "threshold",
                options,
                temperature,
                block_steps=args.masked_steps_per_block,
                guard=ThresholdGuard(0.9),
                block_length=args.masked_block,
            )
        )
    return rows


def rows_for(args) -> list[Row]:
    """Every row, in the table's order; speculative rows only once the sampler is registered
    (said in one printed line)."""
    rows = [
        Row("AR, KV cache, T=1", "ar", "ar", {}, 1.0),
        Row("AR, KV cache, T=0.9", "ar", "ar", {"temperature": 0.9}, 0.9),
        Row("AR, KV cache, T=0 (greedy)", "ar", "ar", {"temperature": 0.0}, 0.0),
    ]
    speculative = "speculative" in SAMPLERS
    if not speculative and args.block_keys:
        print("speculative rows skipped: cdlm.samplers.SAMPLERS has no 'speculative'", flush=True)
    for key in args.block_keys:
        rows += block_rows(key, (1, 2, 4))
        rows += guard_rows(key) if args.guards is None or key in args.guards else []
        rows += speculative_rows(key) if speculative else []
    for key in args.sdtt_keys:
        rows += block_rows(key, (1, 2))
    return rows + masked_rows(args)


def prompt_canvas(model, val: torch.Tensor, tokens: int, new_tokens: int):
    """The first ``tokens`` tokens of the first val sequence as a prompt, ``new_tokens`` after."""
    text = decode(model.tokenizer, val[0, :tokens].tolist(), cut_at_eos=False).text
    tok = model.tokenizer
    fill = tok.mask_token_id if tok.mask_token_id is not None else tok.eos_token_id
    return build_layout(prompt_template(text), tok, tokens + new_tokens, fill)


def measured_row(row: Row, model, batch: int, canvas, args) -> tuple[dict, list]:
    """The row's speed and work at ``batch`` on ``canvas`` (a prompt's layout, or None), and
    its samples."""
    length = args.new_tokens if canvas is None else len(canvas.editable)
    plan = Plan(
        num_samples=batch,
        seq_len=length,
        steps=row.plan_steps(length),
        layout=canvas,
        cut_at_eos=False,  # whole canvases: every row is seq_len tokens, EOS one of them
    )
    sampler = named_sampler(row.sampler, **row.options, stop_at_eos=False)  # the whole canvas
    if row.verifier is not None:
        ar = args.models[row.verifier]
        verifier = ar.process.make_denoiser(ar.network)
        sampler = functools.partial(
            sample_speculative, **row.options, stop_at_eos=False, verifier=verifier
        )
    guarded = None
    if row.guard is not None:
        guarded = GuardedBlocks(row.guard, row.block_length or model.process.block_size)
    measured = measure(model, sampler, plan, args.repeats, guarded)
    speed = measured.as_dict()
    steady, stats = speed["steady"], speed["sampler_stats"]
    accepted = stats.get("accepted_per_call")
    return {
        "prompt_tokens": 0 if canvas is None else sum(not e for e in canvas.editable),
        "steps": plan.steps,
        "tokens_per_s_median": steady["tokens_per_sec"]["median"],
        "tokens_per_s": steady["tokens_per_sec"],
        "wall_seconds": steady["wall_seconds"],
        "nfe": steady["nfe"]["median"],
        "positions": steady["positions"]["median"],
        "first_token_seconds": steady["first_token_seconds"],
        "first_stable_seconds": steady["first_stable_seconds"],
        "memory_kind": speed["memory_kind"],
        "peak_memory_mb": speed["peak_memory_mb"],
        "peak_memory_above_start_mb": speed["peak_memory_above_start_mb"],
        "guard": speed["guard"],
        "sampler_stats": stats,
        "accepted_per_call": None if accepted is None else accepted["median"],
    }, measured.generation.samples


def evaluate(row: Row, model, ckpt: str, batch: int, canvas, args, scorer) -> dict:
    speed, samples = measured_row(row, model, batch, canvas, args)
    prompt = canvas is not None
    out = {
        "name": row.name,
        "process": model.process.kind,
        "sampler": row.sampler,
        "ckpt": ckpt,
        "batch": batch,
        "temperature": row.temperature,
        "new_tokens": args.new_tokens,
    } | speed
    if not prompt:
        q = text_quality([s.token_ids for s in samples], [s.text for s in samples], scorer)
        out |= {"gen_ppl": q.get("gen_ppl"), "entropy": q["token_entropy_bits"]}
    print(
        f"{row.name} batch {batch}{' prompt' if prompt else ''}: "
        f"{out['tokens_per_s_median']:.0f} tok/s",
        flush=True,
    )
    return out


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ar", required=True)
    parser.add_argument("--masked", required=True)
    parser.add_argument("--block", action="append", default=[], help="KEY=PATH, e.g. block4=...")
    parser.add_argument(
        "--sdtt", action="append", default=[], help="KEY=PATH: an SDTT block student"
    )
    parser.add_argument(
        "--guards", action="append", help="KEY: guarded rows for these block models only"
    )
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--masked-block", type=int, default=32)
    parser.add_argument("--masked-steps-per-block", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--likelihood-sequences", type=int, default=128)
    parser.add_argument("--data", help="the models' corpus (default: the bundled one)")
    parser.add_argument("--out", default="docs/results/speed")
    args = parser.parse_args(argv)
    args.ckpts = {"ar": args.ar, "masked": args.masked}
    for flag in ("block", "sdtt"):
        pairs = dict(b.split("=", 1) for b in getattr(args, flag))
        setattr(args, f"{flag}_keys", list(pairs))
        args.ckpts |= pairs
    return args


def run(args: argparse.Namespace, scorer) -> dict:
    """Measures every row at every batch, without and with the prompt; writes the report."""
    ckpts = args.ckpts
    models = args.models = {k: load_model(v) for k, v in ckpts.items()}
    for key, model in models.items():
        if model.config["seq_len"] < args.prompt_tokens + args.new_tokens:
            raise SystemExit(
                f"speed.py: error: {key} ({ckpts[key]}) was trained on {model.config['seq_len']}-token sequences, "
                f"fewer than --prompt-tokens {args.prompt_tokens} + --new-tokens {args.new_tokens}"
            )
    torch.set_grad_enabled(False)
    by_ckpt = {ckpt: models[k] for k, ckpt in ckpts.items()}
    val = {ckpt: validation_tokens(m, args.data) for ckpt, m in by_ckpt.items()}  # once each
    canvases = {
        k: prompt_canvas(m, val[ckpts[k]], args.prompt_tokens, args.new_tokens)
        for k, m in models.items()
    }
    table, rows = rows_for(args), []
    for batch in map(int, args.batches.split(",")):
        for prompt in (False, True):
            for row in table:
                canvas = canvases[row.key] if prompt else None
                model, ckpt = models[row.key], ckpts[row.key]
                rows.append(evaluate(row, model, ckpt, batch, canvas, args, scorer))
                partial = json.dumps({"rows": rows}, indent=1) + "\n"  # what a cut run keeps
                atomic_write_text(Path(args.out).with_suffix(".partial.json"), partial)
    bounds = {
        ckpt: val_bits_per_token(m, val[ckpt][: args.likelihood_sequences], seed=0)
        for ckpt, m in by_ckpt.items()
    }
    report = {
        "repeats": args.repeats,
        "new_tokens": args.new_tokens,
        "prompt_tokens": args.prompt_tokens,
        "masked_block": args.masked_block,
        "masked_steps_per_block": args.masked_steps_per_block,
        "threads": torch.get_num_threads(),
        "rows": rows,
        "bounds": bounds,
    }
    out = Path(args.out)
    atomic_write_text(out.with_suffix(".json"), json.dumps(report, indent=2) + "\n")
    atomic_write_text(out.with_suffix(".md"), markdown(report))
    out.with_suffix(".partial.json").unlink(missing_ok=True)
    return report


def main() -> None:
    args = parse()
    print(markdown(run(args, load_scorer())))


if __name__ == "__main__":
    main()
