"""Gaussian vs masked diffusion vs autoregressive, side by side, from one run.

Trains the three processes with the same Transformer (d_model, layers, heads) and the same
training-token budget (steps x batch x seq_len) on the bundled corpus, through the real
``cdlm-train`` CLI, then reports for each:
  * the validation NLL bound in bits/token over the whole val split (AR: exact NLL; masked: the
    continuous-time ELBO; gaussian: the VDM ELBO of ``cdlm.likelihood``), as the mean of
    ``--repeats`` Monte Carlo passes with its standard error;
  * steady-state training tokens/s and peak memory (``Throughput`` callback);
  * wall time of the training run.
Writes ``<out>.json`` and ``<out>.md``.

    python experiments/compare_processes.py --steps 250 --out docs/results/historical/compare_processes
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import platform
from pathlib import Path

import launch
import torch

from cdlm.evaluation.harness import val_bits_per_token
from cdlm.io import atomic_write_text
from cdlm.likelihood.evaluate import validation_tokens
from cdlm.model_file import load_model

PROCESSES = ("autoregressive", "masked", "gaussian")


def train(process: str, run_dir: Path, args: argparse.Namespace) -> float:
    overrides = [
        f"process={process}",
        f"trainer.max_steps={args.steps}",
        "trainer.max_time=null",
        f"trainer.val_check_interval={args.steps}",
        f"data.batch_size={args.batch_size}",
        f"data.seq_len={args.seq_len}",
        f"network.d_model={args.d_model}",
        f"network.n_layers={args.n_layers}",
        "logger=csv",
        "callbacks.samples.num_samples=0",
        f"lr_scheduler.warmup_steps={max(1, args.steps // 10)}",
        f"hydra.run.dir={run_dir}",
        f"seed={args.seed}",
        f"callbacks.ema.decay={args.ema_decay}",
    ]
    return launch.train(overrides, wandb=False).wall_seconds


def last_metrics(run_dir: Path) -> dict[str, float]:
    out: dict[str, float] = {}
    with open(run_dir / "csv" / "version_0" / "metrics.csv") as f:
        for row in csv.DictReader(f):
            out |= {k: float(v) for k, v in row.items() if v not in ("", None)}
    return out


def bound(ckpt: Path, repeats: int, seed: int) -> tuple[float, float, dict]:
    """Mean and standard error over ``repeats`` draws of the val bound, bits/token."""
    model = load_model(ckpt)
    result = val_bits_per_token(model, validation_tokens(model), seed, draws=repeats)
    return result["bits_per_token"], result.get("std_error", 0.0), result.get("terms", {})


def table(rows: list[dict], budget: str) -> str:
    ar = next(r for r in rows if r["process"] == "autoregressive")["bits_per_token"]
    lines = [
        f"Budget: {budget}.",
        "",
        "| process | val bits/token (bound) | ratio to AR | train tokens/s | peak memory (MB) "
        "| train wall (s) |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['process']} | {r['bits_per_token']:.3f} ± {r['stderr']:.3f} | "
            f"{r['bits_per_token'] / ar:.3f} | {r['tokens_per_sec']:.0f} | "
            f"{r['peak_memory_mb']:.0f} | {r['train_seconds']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=250)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--n-layers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument(
        "--ema-decay",
        type=float,
        default=0.99,
        help="EMA decay; the default 0.999 averages in the random init at short budgets",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--runs", default="outputs/compare_processes")
    parser.add_argument("--out", default="docs/results/historical/compare_processes")
    args = parser.parse_args()
    rows = []
    for process in PROCESSES:
        run_dir = Path(args.runs) / process
        seconds = train(process, run_dir, args)
        metrics = last_metrics(run_dir)
        mean, stderr, terms = bound(run_dir / "model.safetensors", args.repeats, args.seed)
        rows.append(
            {
                "process": process,
                "bits_per_token": mean,
                "stderr": stderr,
                "terms": terms,
                "tokens_per_sec": metrics.get("train/tokens_per_sec", math.nan),
                "peak_memory_mb": metrics["train/peak_memory_mb"],
                "train_seconds": seconds,
            }
        )
        print(rows[-1], flush=True)
    tokens = args.steps * args.batch_size * args.seq_len
    budget = (
        f"{tokens:,} training tokens each ({args.steps} steps x {args.batch_size} x "
        f"{args.seq_len}); Transformer d_model={args.d_model}, {args.n_layers} layers; bundled "
        f"Austen corpus; bf16 autocast; torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, {platform.processor() or platform.machine()}"
    )
    report = {"budget": budget, "args": vars(args), "rows": rows}
    atomic_write_text(f"{args.out}.json", json.dumps(report, indent=2) + "\n")
    atomic_write_text(f"{args.out}.md", table(rows, budget))
    print(table(rows, budget))


if __name__ == "__main__":
    main()
