"""Prompt guidance against the truth on a tiny world (issue 50, item 4): what classifier-free
guidance on fixed text does to an exact oracle, by enumeration in float64.

A one-token-per-call sampler (masked ancestral, ``block_length=1``: left to right) under
prompt guidance at scale w draws each token from the per-step tilt
p(x_i | context, prompt)^w p(x_i | context, prompt at the prior)^(1 - w), renormalised. At w = 1
that is the exact conditional p(span | fixed text) (``cdlm.worlds.conditional``); at other w it
is neither the conditional nor, in general, the closed form p(x | c)^w p(x)^(1 - w).
"""

import math
from functools import partial

import pytest
import torch
from test_worlds import enumerate_world, tiny_world

from cdlm.configs import compose
from cdlm.generation import Plan, generate
from cdlm.guidance import Guidance
from cdlm.model_file import oracle_model
from cdlm.regions import build_layout, parse_template
from cdlm.samplers.masked import sample_masked
from cdlm.samplers.rules import Ancestral
from cdlm.worlds.conditional import condition

A, C = 3, 5  # the tiny world's ids of "a" and "c"; its three symbols are ids 3, 4, 5


@pytest.fixture(scope="module")
def tiny():
    world = tiny_world(length=4)
    model = oracle_model(world, compose("train", ["process=masked"]).process)
    tok = model.tokenizer
    layout = build_layout(parse_template("a[[2]]c"), tok, 4, tok.mask_token_id)
    return world, model, layout, enumerate_world(world, 4)


def marginal(enumerated, i: int, seen: dict[int, int]) -> torch.Tensor:
    """(3,) p(x_i | the tokens ``seen``), by enumeration."""
    seqs, p = enumerated
    keep = torch.ones(len(seqs), dtype=torch.bool)
    for j, v in seen.items():
        keep &= seqs[:, j] == v
    out = torch.zeros(6, dtype=torch.float64).index_add_(0, seqs[keep, i], p[keep])[3:]
    return out / out.sum()


def tilt(cond: torch.Tensor, uncond: torch.Tensor, w: float) -> torch.Tensor:
    q = cond.pow(w) * uncond.pow(1 - w)
    return q / q.sum()


def per_step(enumerated, w: float) -> torch.Tensor:
    """(3, 3) the left-to-right guided sampler's law of (x_1, x_2) given x_0 = a, x_3 = c."""
    q1 = tilt(marginal(enumerated, 1, {0: A, 3: C}), marginal(enumerated, 1, {}), w)
    rows = [
        q1[x1] * tilt(marginal(enumerated, 2, {0: A, 1: x1 + 3, 3: C}),
                      marginal(enumerated, 2, {1: x1 + 3}), w)
        for x1 in range(3)
    ]  # fmt: skip
    return torch.stack(rows)


def closed_form(enumerated, w: float) -> torch.Tensor:
    """(3, 3) p(x_1, x_2 | a, c)^w p(x_1, x_2)^(1 - w), renormalised."""
    seqs, p = enumerated
    joint, cond = torch.zeros(3, 3, dtype=torch.float64), torch.zeros(3, 3, dtype=torch.float64)
    for s, q in zip(seqs.tolist(), p.tolist(), strict=True):
        joint[s[1] - 3, s[2] - 3] += q
        if s[0] == A and s[3] == C:
            cond[s[1] - 3, s[2] - 3] += q
    return tilt((cond / cond.sum()).flatten(), joint.flatten(), w).view(3, 3)


def guided_draws(model, layout, w: float, n: int) -> torch.Tensor:
    plan = Plan(
        num_samples=n,
        seq_len=4,
        steps=8,
        seed=0,
        layout=layout,
        guidance=Guidance(scale=w, on="prompt"),
        cut_at_eos=False,
    )
    sampler = partial(sample_masked, rule=Ancestral(), block_length=1)
    return torch.tensor([s.token_ids for s in generate(model, sampler, plan).samples])


@pytest.mark.parametrize("w", [1.0, 2.0])
def test_one_token_per_call_prompt_guidance_draws_the_per_step_tilt(tiny, w):
    world, model, layout, enumerated = tiny
    n = 4000
    draws = guided_draws(model, layout, w, n)
    assert (draws[:, 0] == A).all() and (draws[:, 3] == C).all()
    counts = torch.zeros(3, 3, dtype=torch.float64)
    counts.index_put_(
        (draws[:, 1] - 3, draws[:, 2] - 3), torch.tensor(1.0, dtype=torch.float64), accumulate=True
    )
    law = per_step(enumerated, w)
    chi2 = float(((counts - n * law) ** 2 / (n * law)).sum())
    assert chi2 < 8 + 5 * math.sqrt(16), chi2  # 8 degrees of freedom, about 5 sd above
    if w == 1.0:  # the conditional pass alone: the exact conditional, nothing else
        cond = condition(world, torch.tensor(layout.ids), torch.tensor(layout.editable))
        grid = torch.tensor([[A, a + 3, b + 3, C] for a in range(3) for b in range(3)])
        torch.testing.assert_close(law.flatten(), cond.log_prob(grid).exp(), rtol=1e-12, atol=0)


def test_only_scale_one_is_the_exact_conditional():
    """On the oracle the guided law moves away from the conditional as w leaves 1, and for
    w != 0, 1 it is not the closed form p(x|c)^w p(x)^(1-w) either (a little, on this chain)."""
    world = tiny_world(length=4)
    enumerated = enumerate_world(world, 4)
    exact = closed_form(enumerated, 1.0)

    def kl(p, q):
        return float((p * (p / q).log()).sum())

    gaps = [kl(per_step(enumerated, w), exact) for w in (1.0, 1.5, 2.0)]
    assert gaps[0] == pytest.approx(0.0, abs=1e-14) and 0 < gaps[1] < gaps[2]
    assert kl(per_step(enumerated, 0.0), closed_form(enumerated, 0.0)) == pytest.approx(
        0, abs=1e-14
    )
    assert kl(per_step(enumerated, 2.0), closed_form(enumerated, 2.0)) > 1e-5
