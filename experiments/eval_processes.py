"""Sample quality and sampling speed of trained AR, masked and gaussian checkpoints, one run.

For each checkpoint: ``cdlm-eval``'s harness with the process's default sampler, 32 samples
scored at equal length (whole 128-token canvases, EOS written as a line break, the AR sampler not
stopping at EOS), gen-PPL under SmolLM2 and entropy beside real val text of the same length. Then the masked sampler against the KV-cached AR sampler at batch 1 and batch 32
(tokens/s on final tokens, median of the timed runs). Writes ``<out>.json`` and ``<out>.md``.

    python experiments/eval_processes.py --runs outputs/compare_processes --out docs/results/historical/eval_processes
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from cdlm.evaluation.harness import evaluate_checkpoint
from cdlm.evaluation.quality import load_scorer
from cdlm.generation import named_sampler
from cdlm.io import atomic_write_text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", default="outputs/compare_processes")
    parser.add_argument("--out", default="docs/results/historical/eval_processes")
    parser.add_argument("--num-samples", type=int, default=32)
    parser.add_argument("--masked-steps", type=int, default=128)
    parser.add_argument("--gaussian-steps", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    cpu, runs = torch.device("cpu"), Path(args.runs)
    scorer = load_scorer()
    plan = [
        ("autoregressive", named_sampler("ar", stop_at_eos=False), 1),
        ("masked", named_sampler("ancestral"), args.masked_steps),
        ("gaussian", named_sampler("ddpm"), args.gaussian_steps),
    ]
    quality, speed = {}, {}
    for process, fn, steps in plan:
        ckpt = runs / process / "model.safetensors"
        report = evaluate_checkpoint(
            str(ckpt),
            fn,
            steps=steps,
            num_samples=args.num_samples,
            seed=0,
            repeats=args.repeats,
            grid="uniform",
            scorer=scorer,
            device=cpu,
            cut_at_eos=False,
        )
        quality[process] = report
        print(process, json.dumps(report["quality"]), flush=True)
    for process, fn, steps in plan[:2]:
        for batch in (1, 32):
            report = evaluate_checkpoint(
                str(runs / process / "model.safetensors"),
                fn,
                steps=steps,
                num_samples=batch,
                seed=0,
                repeats=args.repeats,
                grid="uniform",
                scorer=None,
                device=cpu,
                likelihood_sequences=1,
                cut_at_eos=False,  # both fill the whole canvas: tokens/s over the same output
            )
            speed[f"{process}@{batch}"] = report["speed"]
    lines = [
        f"Samples: {args.num_samples} per model, seq_len 128, seed 0; samplers: AR `ar` (KV "
        f"cache), masked `ancestral` {args.masked_steps} steps, gaussian `ddpm` "
        f"{args.gaussian_steps} steps; all 128 tokens of every canvas scored (EOS as line break). "
        f"Scorer: {scorer.name}, float64 log-softmax. Real text: val sequences of the same length.",
        "",
        "| model | gen-PPL | token entropy (bits) | distinct-2 | mean length | real-text gen-PPL "
        "| real-text entropy | val bits/token |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for process, r in quality.items():
        s, ref = r["quality"]["samples"], r["quality"]["reference"]
        lines.append(
            f"| {process} | {s['gen_ppl']:.1f} | {s['token_entropy_bits']:.2f} | "
            f"{s['distinct_2']:.3f} | {s['mean_length']:.1f} | {ref['gen_ppl']:.1f} | "
            f"{ref['token_entropy_bits']:.2f} | {r['likelihood']['bits_per_token']:.3f} "
            f"({r['likelihood']['kind']}) |"
        )
    lines += [
        "",
        "| sampling speed | batch 1 tokens/s | batch 32 tokens/s | NFE | positions |",
        "|---|---|---|---|---|",
    ]
    ratios = {}
    for process in ("autoregressive", "masked"):
        one, many = speed[f"{process}@1"]["steady"], speed[f"{process}@32"]["steady"]
        ratios[process] = (one["tokens_per_sec"]["median"], many["tokens_per_sec"]["median"])
        lines.append(
            f"| {process} | {ratios[process][0]:.1f} | {ratios[process][1]:.1f} | "
            f"{many['nfe']['median']} | {many['positions']['median']} |"
        )
    r1 = ratios["masked"][0] / ratios["autoregressive"][0]
    r32 = ratios["masked"][1] / ratios["autoregressive"][1]
    lines += ["", f"Masked / KV-cached AR tokens/s: {r1:.3f} at batch 1, {r32:.3f} at batch 32."]
    atomic_write_text(
        f"{args.out}.json",
        json.dumps(
            {"quality": quality, "speed": speed, "ratio_batch1": r1, "ratio_batch32": r32},
            indent=2,
            default=str,
        )
        + "\n",
    )
    atomic_write_text(f"{args.out}.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
