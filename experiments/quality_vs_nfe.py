"""Sample quality against network evaluations (NFE) for every gaussian sampler.

    python experiments/quality_vs_nfe.py outputs/quickstart/model.safetensors [--batch 4]

All runs start from the same prior draw (seed 0) and, for stochastic samplers, the same noise
seed. Per run it records NFE, wall seconds and:
  * ``ode_agreement``: fraction of final tokens equal to those of the probability-flow ODE solved
    to convergence from the same draw (DPM-Solver++(2M), 500 log-SNR steps). Deterministic samplers
    converge to it; for stochastic ones it is only a baseline.
  * ``ddpm_agreement``: the same against a 1000-step DDPM run (same prior draw and noise seed).
    Different step counts consume the noise differently, so this is near chance for every
    sampler: reported to show why it is not the criterion.
  * ``consistency``: the model's own token accuracy when its sample is re-noised to t = 0.5 and
    denoised (``process.evaluate_at``): samples the model finds typical score like held-out text.
    "Matches 1000-step DDPM" means consistency within one standard error of DDPM-1000's.
  * ``gen_ppl`` and ``token_entropy_bits``: generative perplexity of the samples (whole canvases,
    EOS as line breaks) under the external scorer (``cdlm.evaluation.quality``, SmolLM2-135M by
    default), with the unigram entropy beside it; real val text of the same length is the
    reference line.
Writes docs/results/quality_vs_nfe.json and docs/results/quality_vs_nfe.png.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from cdlm.evaluation import harness  # noqa: E402
from cdlm.evaluation.quality import load_scorer  # noqa: E402
from cdlm.generation import decode  # noqa: E402
from cdlm.io import atomic_write_text  # noqa: E402
from cdlm.likelihood.evaluate import validation_tokens  # noqa: E402
from cdlm.model_file import load_model  # noqa: E402
from cdlm.samplers import (  # noqa: E402
    make_grid,
    sample_adaptive,
    sample_ddpm,
    sample_dpmpp_2m,
    sample_euler,
    sample_euler_maruyama,
    sample_heun,
)

DOCS = Path(__file__).resolve().parent.parent / "docs" / "results"
RUNS = [  # (label, sampler, grid, steps, options)
    *[("ddpm", sample_ddpm, "uniform", n, {}) for n in (10, 25, 50, 100, 250)],
    *[("euler_maruyama", sample_euler_maruyama, "uniform", n, {}) for n in (10, 25, 50, 100, 250)],
    *[("euler (= ddim)", sample_euler, "uniform", n, {}) for n in (5, 10, 25, 50, 100)],
    *[("heun", sample_heun, "uniform", n, {}) for n in (3, 5, 10, 25, 50)],
    *[("dpmpp_2m", sample_dpmpp_2m, "logsnr", n, {}) for n in (5, 10, 25, 50, 100)],
    *[
        ("adaptive RK45", sample_adaptive, "uniform", 1, {"rtol": r, "atol": r})
        for r in (1e-2, 1e-3)
    ],
]


def run(model, x1, label, sampler, grid, steps, options) -> tuple[dict, torch.Tensor]:
    process = model.process
    denoiser = process.sampling_denoiser(model.network)
    start = time.perf_counter()
    out = sampler(
        denoiser,
        x1.clone(),
        make_grid(grid, steps, process.schedule),
        process=process,
        generator=torch.Generator().manual_seed(1),
        **options,
    )
    seconds = time.perf_counter() - start
    g = torch.Generator().manual_seed(2)
    check = process.evaluate_at(model.denoiser, out.tokens, 0.5, generator=g)
    record = {"sampler": label, "grid": grid, "steps": steps, "nfe": out.nfe, **options}
    return record | {"wall_seconds": round(seconds, 2), "consistency": float(check.acc)}, out.tokens


def text_quality(model, tokens: torch.Tensor, scorer) -> dict:
    """gen-PPL and token entropy of (B, L) token ids, whole canvases, as ``cdlm-eval`` scores
    them (the harness's other diversity figures are left out of this report)."""
    samples = [decode(model.tokenizer, row, cut_at_eos=False) for row in tokens.tolist()]
    q = harness.text_quality([s.token_ids for s in samples], [s.text for s in samples], scorer)
    return {k: q[k] for k in ("gen_ppl", "token_entropy_bits")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("ckpt")
    parser.add_argument("--batch", type=int, default=4)
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    model = load_model(args.ckpt)
    shape = (args.batch, model.config["seq_len"])
    x1 = model.process.prior(shape, torch.device("cpu"), torch.Generator().manual_seed(0))
    scorer = load_scorer()
    real = text_quality(model, validation_tokens(model)[: args.batch], scorer)
    ode_ref, ode_tokens = run(model, x1, "reference ODE", sample_dpmpp_2m, "logsnr", 500, {})
    ddpm_ref, ddpm_tokens = run(model, x1, "reference DDPM", sample_ddpm, "uniform", 1000, {})
    ode_ref |= text_quality(model, ode_tokens, scorer)
    ddpm_ref |= text_quality(model, ddpm_tokens, scorer)
    records = []
    for spec in RUNS:
        record, tokens = run(model, x1, *spec)
        record |= text_quality(model, tokens, scorer)
        record["ode_agreement"] = float((tokens == ode_tokens).float().mean())
        record["ddpm_agreement"] = float((tokens == ddpm_tokens).float().mean())
        records.append(record)
        print(json.dumps(record))
    n_tokens = shape[0] * shape[1]
    c = ddpm_ref["consistency"]
    se = math.sqrt(c * (1 - c) / n_tokens)
    needed = {}
    for label in ("heun", "dpmpp_2m", "euler (= ddim)"):
        ok = [r["nfe"] for r in records if r["sampler"] == label and r["consistency"] >= c - se]
        needed[label] = min(ok) if ok else None
    report = {
        "ckpt": args.ckpt,
        "tokens": n_tokens,
        "reference_ode": ode_ref,
        "reference_ddpm": ddpm_ref | {"consistency_standard_error": se},
        "real_text": real,
        "nfe_to_match_ddpm_1000": needed,
        "runs": records,
    }
    atomic_write_text(DOCS / "quality_vs_nfe.json", json.dumps(report, indent=2) + "\n")
    plot(records, ddpm_ref, se, real)
    print(json.dumps(needed))


def plot(records: list[dict], ddpm_ref: dict, se: float, real: dict) -> None:
    fig, (left, right, third) = plt.subplots(1, 3, figsize=(16, 4))
    for label in dict.fromkeys(r["sampler"] for r in records):
        rs = [r for r in records if r["sampler"] == label]
        nfe = [r["nfe"] for r in rs]
        left.plot(nfe, [r["consistency"] for r in rs], "o-", label=label)
        right.plot(nfe, [r["ode_agreement"] for r in rs], "o-", label=label)
        third.plot(nfe, [r["gen_ppl"] for r in rs], "o-", label=label)
    c = ddpm_ref["consistency"]
    left.axhspan(c - se, c + se, color="grey", alpha=0.3, label="DDPM 1000 steps (+-1 SE)")
    left.set(xscale="log", xlabel="NFE", ylabel="model re-prediction accuracy at t=0.5")
    right.set(xscale="log", xlabel="NFE", ylabel="token agreement with converged ODE")
    left.set_title("consistency (higher: more typical samples)")
    right.set_title("convergence to the probability-flow ODE")
    third.axhline(ddpm_ref["gen_ppl"], color="grey", ls=":", label="DDPM 1000 steps")
    third.axhline(real["gen_ppl"], color="black", ls="--", label="real val text")
    third.set(xscale="log", yscale="log", xlabel="NFE", ylabel="gen. perplexity (SmolLM2-135M)")
    third.set_title("generative perplexity (entropy in the JSON)")
    third.legend(fontsize=7)
    left.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(DOCS / "quality_vs_nfe.png", dpi=110)


if __name__ == "__main__":
    main()
