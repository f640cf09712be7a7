"""The block layouts on the exact denoiser of the character world (issue 51): docs/worlds.md.

    python experiments/block_layouts.py --out /tmp/block_layouts.json   # ~6 min on one thread

For each layout of ``process=block`` (size 4: shifted with its tail, the default; shifted blind
to each block's last token, ``process.sees_last=false``; unshifted, BD3-LM's) it draws
``--samples`` sequences with ``sampler=block`` at 4 and 16 steps per block with the default
ancestral rule (one token per call on average, and closer to one at a time), and at 4 with
exactly one token per call in a uniform order (``sampler.rule=exact_k``, k = 1), and
scores them with the world (``cdlm.evaluation.world_score``: the KL rate beside its floor). It also
integrates the oracle's block ELBO on exact world samples (stratified levels, evaluation mode)
and gives it beside the same sequences' NLL under the world: with every revealed token in view
the two agree in expectation, so their paired difference is the layout's own excess.
"""

from __future__ import annotations

import argparse
import functools
import json
import math

import torch

from cdlm import worlds
from cdlm.configs import compose
from cdlm.evaluation.world_score import score_samples
from cdlm.generation import Plan, named_sampler
from cdlm.generation.generate import generate
from cdlm.model_file import oracle_model
from cdlm.samplers.masked import sample_block
from cdlm.samplers.rules import ExactK

LAYOUTS = {
    "shifted, with its tail (the default)": ["process=block"],
    "shifted, blind to its last token": ["process=block", "process.sees_last=false"],
    "unshifted (BD3-LM)": ["process=block", "process.shift=false", "process.causal_clean=false",
                           "process.ar_weight=0"],
}  # fmt: skip
FLOOR_REPEATS = 8
LN2 = math.log(2)


def mean_se(x: torch.Tensor) -> tuple[float, float]:
    return float(x.mean()), float(x.std() / math.sqrt(len(x)))


@torch.no_grad()
def bound_rows(model, world, n: int, draws: int) -> torch.Tensor:
    """(n,) each exact sample's block ELBO in bits/token, averaged over ``draws`` stratified
    levels, minus its NLL under the world (the process's own evaluation integrand)."""
    process = model.process.eval()
    denoiser = process.make_denoiser(model.network)
    tokens = world.sample(n, world.length, torch.Generator().manual_seed(2))
    g = torch.Generator().manual_seed(3)
    valid = torch.ones_like(tokens, dtype=torch.bool)
    total = torch.zeros(n, dtype=torch.float64)
    for _ in range(draws):
        t = process.sample_t(n, g, length=tokens.shape[1])
        c = process.corrupt(tokens, t, g)
        noisy, _ = denoiser.streams(c.x_t, c.tokens)
        integrand, _ = process.elbo_terms(denoiser.parameterize(noisy, c.x_t).logits, c, valid)
        total += integrand.double() / tokens.shape[1] / LN2
    return total / draws + world.log_prob(tokens).double() / tokens.shape[1] / LN2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument("--bound-samples", type=int, default=256)
    parser.add_argument("--draws", type=int, default=2)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    world = worlds.load("world:chars", length=args.length)
    reference = world.transition_reference(args.length)
    rows = []
    for label, overrides in LAYOUTS.items():
        model = oracle_model(world, compose("train", overrides).process)
        excess, excess_se = mean_se(bound_rows(model, world, args.bound_samples, args.draws))
        runs = [
            ("ancestral", 4, named_sampler("block", steps_per_block=4)),
            ("ancestral", 16, named_sampler("block", steps_per_block=16)),
            ("one at a time", 4, functools.partial(sample_block, rule=ExactK(k=1), steps_per_block=4)),
        ]  # fmt: skip
        for rule, per_block, sampler in runs:
            steps = args.length // 4 * per_block
            plan = Plan(args.samples, seq_len=args.length, steps=steps, seed=0, cut_at_eos=False)
            gen = generate(model, sampler, plan)
            tokens = torch.tensor([s.token_ids for s in gen.samples])
            score = score_samples(
                world, tokens, floor_repeats=FLOOR_REPEATS,
                generator=torch.Generator().manual_seed(1), reference=reference,
            )  # fmt: skip
            rows.append(
                {"layout": label, "rule": rule, "steps_per_block": per_block, "nfe": gen.nfe}
                | {k: score[k] for k in ("kl_rate", "kl_floor", "kl_floor_se", "entropy_rate")}
                | {"kl_rate_se": score["kl_floor_se"] * math.sqrt(FLOOR_REPEATS)}
                | {"bound_minus_nll": excess, "bound_minus_nll_se": excess_se}
            )
            print(json.dumps(rows[-1]), flush=True)
    print("| layout | rule | steps/block | NFE | KL rate (bits) | bound − NLL (bits/token) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['layout']} | {r['rule']} | {r['steps_per_block']} | {r['nfe']} | "
            f"{r['kl_rate']:.4f} ± {r['kl_rate_se']:.4f} | {r['bound_minus_nll']:+.3f} ± "
            f"{r['bound_minus_nll_se']:.3f} |"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
