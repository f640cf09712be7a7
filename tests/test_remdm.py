"""ReMDM (cdlm.samplers.remdm) against the reference code's update, re-derived here in float64.

The reference is kuleshov-group/remdm at commit f830d659fb98d9b2c79ff71bfa12d578312b688a,
``diffusion.py: Diffusion._ddpm_caching_update``: with move chances t and s = t - dt (a
loglinear schedule, alpha = 1 - t), it builds one unnormalised categorical ``q_xs`` over the
vocabulary and [MASK] per position, ``p_x0 * (1 - sigma)`` plus sigma on [MASK] where the token
is committed (``p_x0`` there is SUBS's one-hot of the token), and ``p_x0 * (alpha_s - (1 -
sigma) alpha_t) / (1 - alpha_t)`` plus ``(1 - alpha_s - sigma alpha_t) / (1 - alpha_t)`` on
[MASK] where it is masked, and draws from it. ``reference_q`` below writes that update out for
each schedule (remdm-cap, remdm-rescale, remdm-conf, remdm-loop); the rule must give the same
distribution at every position, and the same draw from the same uniforms.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch

from cdlm.processes.masked import MaskedProcess
from cdlm.samplers import uniform_grid
from cdlm.samplers.base import sample_categorical
from cdlm.samplers.masked import sample_masked
from cdlm.samplers.masked_steps import Interval
from cdlm.samplers.remdm import ReMDM
from cdlm.samplers.rules import Ancestral, Window
from cdlm.schedules import LogLinearMaskSchedule

V, MASK = 6, 5  # ids 0..4, [MASK] = 5 (inside the vocabulary, as in the reference)
F64 = torch.float64
KEEP = LogLinearMaskSchedule(eps=0.0).keep  # alpha_t = 1 - t: the reference's loglinear


def fixed_inputs(seed: int = 0, batch: int = 3, length: int = 8):
    """A canvas with committed and masked positions, and SUBS log-probabilities: the network's
    beliefs at masked positions (never [MASK]), a one-hot of the token where committed."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, MASK, (batch, length), generator=g)
    x[torch.rand(batch, length, generator=g) < 0.5] = MASK
    x[0, 0], x[0, 1] = MASK, 2  # at least one of each in every case
    logits = torch.randn(batch, length, V, generator=g, dtype=F64) * 2
    logits[..., MASK] = -math.inf
    one_hot = torch.full((batch, length, V), -math.inf, dtype=F64)
    one_hot.scatter_(-1, x.clamp(max=MASK - 1)[..., None], 0.0)
    logp = torch.where((x != MASK)[..., None], one_hot, logits.log_softmax(-1))
    return x, logp


def reference_q(x, p_x0, t: float, dt: float, rule: ReMDM, conf=None):
    """The reference's ``q_xs`` (B, L, V) for one step from t, re-derived (see the module
    docstring); ``conf``: the remdm-conf scores (B, L)."""
    move_t, move_s = t, t - dt
    if rule.schedule == "loop":
        if t > rule.t_on:
            move_t = 1 - (1 - t) * rule.alpha_on / (1 - rule.t_on)
            move_s = 1 - (1 - t + dt) * rule.alpha_on / (1 - rule.t_on)
        elif t <= rule.t_off:
            move_t = t * (1 - rule.alpha_on) / rule.t_off
            move_s = (t - dt) * (1 - rule.alpha_on) / rule.t_off
        else:  # the loop phase
            sigma, a = rule.eta, rule.alpha_on
            q = p_x0 * (1 - sigma)
            q[..., MASK] = sigma
            q2 = p_x0 * ((a - (1 - sigma) * a) / (1 - a))
            q2[..., MASK] = (1 - a - a * sigma) / (1 - a)
            return torch.where((x != MASK)[..., None], q, q2)
        q = p_x0 * (move_t - move_s)
        q[..., MASK] = move_s
        q = q / move_t  # the reference draws from q unnormalised; the same distribution
        committed = torch.zeros_like(p_x0).scatter_(-1, x[..., None], 1.0)
        return torch.where((x != MASK)[..., None], committed, q)
    alpha_t, alpha_s = 1 - move_t, 1 - move_s
    smax = min(1, (1 - alpha_s) / alpha_t) if alpha_t > 0 else 1
    if rule.schedule == "cap":
        sigma = min(rule.eta, (1 - alpha_s) / alpha_t) if alpha_t > 0 else rule.eta
    elif rule.schedule == "rescale":
        sigma = rule.eta * smax
    else:
        eta = conf.softmax(-1)
        eta[x == MASK] = 0
        sigma = (eta * smax)[..., None]
    q = p_x0 * (1 - sigma)
    q[..., MASK] = sigma if not torch.is_tensor(sigma) else sigma[..., 0]
    q2 = p_x0 * ((alpha_s - (1 - sigma) * alpha_t) / (1 - alpha_t))
    mask2 = (1 - alpha_s - sigma * alpha_t) / (1 - alpha_t)
    q2[..., MASK] = mask2 if not torch.is_tensor(mask2) else mask2[..., 0]
    return torch.where((x != MASK)[..., None], q, q2)


def rule_q(x, logp, rule: ReMDM, iv: Interval, memo=None):
    """The rule's step as one categorical (B, L, V): unmask to p_theta or stay masked; keep
    the token or remask."""
    w = Window(x, logp, torch.ones_like(x, dtype=torch.bool), MASK, memo)
    p = rule.probabilities(w, iv)
    masked = (x == MASK)[..., None]
    kept = torch.zeros_like(logp).scatter_(-1, x[..., None], 1.0)
    q = torch.where(masked, p.unmask[..., None] * logp.exp(), (1 - p.remask[..., None]) * kept)
    q[..., MASK] += torch.where(x == MASK, 1 - p.unmask, p.remask)
    return q


RULES = {
    "cap": ReMDM(schedule="cap", eta=0.05),
    "cap_binding": ReMDM(schedule="cap", eta=0.9),  # (1 - alpha_s) / alpha_t caps it
    "rescale": ReMDM(schedule="rescale", eta=0.7),
    "conf": ReMDM(schedule="conf"),
    "loop": ReMDM(schedule="loop", eta=0.05, t_on=0.6, t_off=0.2, alpha_on=0.8),
}


@pytest.mark.parametrize("name", RULES)
@pytest.mark.parametrize("t", [0.95, 0.7, 0.5, 0.3, 0.1])
def test_the_step_is_the_reference_update(name, t):
    """Exact probabilities on fixed logits (float64), for each schedule at times in each piece
    of the loop schedule; a step of 1/10 as in the reference's uniform grid."""
    rule, dt = RULES[name], 0.1
    x, logp = fixed_inputs()
    conf = None
    if rule.schedule == "conf":  # scores of committed tokens: -p of the token when committed
        g = torch.Generator().manual_seed(3)
        conf = (-torch.rand(x.shape, generator=g, dtype=F64)).masked_fill(x == MASK, -math.inf)
    iv = Interval.between(KEEP, t, t - dt, 5)
    ours = rule_q(x, logp, rule, iv, conf)
    theirs = reference_q(x, logp.exp(), t, dt, rule, conf)
    torch.testing.assert_close(ours, theirs, atol=1e-12, rtol=0)
    torch.testing.assert_close(ours.sum(-1), torch.ones(x.shape, dtype=F64), atol=1e-12, rtol=0)
    remasks = ours[..., MASK][x != MASK]
    looping = rule.t_off < t <= rule.t_on
    revises = t - dt > 1e-9 and (name != "loop" or looping)  # never at the last step
    assert bool((remasks > 0).any()) is revises


@pytest.mark.parametrize("name", RULES)
def test_the_draw_is_the_reference_draw_from_the_same_uniforms(name):
    """One uniform per position decides (masked: unmask iff u < 1 - q[MASK]; committed: remask
    iff u < q[MASK], from the reference's q); then Gumbel-max on p_theta at the unmasked
    positions, from the same generator. conf: the scores are updated as the reference does."""
    rule, t, dt = RULES[name], 0.5, 0.1
    x, logp = fixed_inputs(seed=1)
    memo = None if rule.schedule != "conf" else torch.full(x.shape, -math.inf, dtype=F64)
    if memo is not None:
        memo[x != MASK] = -torch.rand(
            int((x != MASK).sum()), generator=torch.Generator(), dtype=F64
        )
    conf = None if memo is None else memo.clone()
    q = reference_q(x, logp.exp(), t, dt, rule, conf)
    iv = Interval.between(KEEP, t, t - dt, 5)
    for seed in range(5):
        g = torch.Generator().manual_seed(seed)
        u = torch.rand(x.shape, generator=g, dtype=F64)
        unmask = (x == MASK) & (u < 1 - q[..., MASK])
        remask = (x != MASK) & (u < q[..., MASK])
        expected = x.clone()
        expected[unmask] = sample_categorical(logp[unmask], g)
        expected[remask] = MASK
        kept = None if memo is None else memo.clone()
        w = Window(x, logp, torch.ones_like(x, dtype=torch.bool), MASK, kept)
        got = rule.step(w, iv, torch.Generator().manual_seed(seed))
        assert torch.equal(got, expected)
        if kept is not None:  # the reference's update of conf
            scores = conf.clone()
            scores[unmask] = -logp.exp().gather(-1, expected[..., None]).squeeze(-1)[unmask]
            scores[remask] = -math.inf
            torch.testing.assert_close(kept, scores, atol=0, rtol=0)


def test_without_remasking_it_is_ancestral_sampling_for_all_its_steps():
    """eta = 0: the same tokens as MDLM's ancestral sampler from the same generator, at one
    network call per step (a revising rule runs its whole budget)."""
    process = MaskedProcess(vocab_size=V, mask_id=MASK, schedule=LogLinearMaskSchedule(eps=0.0))
    x, logp = fixed_inputs(seed=2, batch=4, length=10)

    class Fixed:
        calls = 0

        def network_length(self, n):
            return n

        def __call__(self, z, t, **kw):
            from cdlm.denoiser import Prediction

            self.calls += 1
            return Prediction(logits=logp)

    start = torch.full_like(x, MASK)
    run = functools.partial(
        sample_masked, x=start, timesteps=uniform_grid(8), process=process, callback=None
    )
    anc = run(Fixed(), rule=Ancestral(), generator=torch.Generator().manual_seed(0))
    rem = run(Fixed(), rule=ReMDM(eta=0.0), generator=torch.Generator().manual_seed(0))
    assert torch.equal(anc.tokens, rem.tokens) and rem.nfe == 8 >= anc.nfe


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"schedule": "max"}, "schedule must be one of cap, rescale, conf, loop"),
        ({"eta": -0.1}, "eta must be >= 0"),
        ({"schedule": "rescale", "eta": 1.5}, "eta must be >= 0"),
        ({"schedule": "loop", "t_on": 0.1, "t_off": 0.2}, "0 < t_off < t_on < 1"),
        ({"schedule": "loop", "eta": 0.5, "alpha_on": 0.9}, r"eta <= \(1 - alpha_on\)"),
    ],
)
def test_options_out_of_range_are_refused_when_the_rule_is_built(options, message):
    with pytest.raises(ValueError, match=message):
        ReMDM(**options)


@pytest.fixture(scope="module")
def tiny_block_checkpoint(tmp_path_factory, tiny_corpus):
    from conftest import train_tiny

    return train_tiny(tmp_path_factory, tiny_corpus, "process=block")


@pytest.mark.parametrize("kind", ["masked", "block"])
def test_cdlm_sample_remdm_runs_on_masked_and_block_models(kind, request, tmp_path):
    """``cdlm-sample sampler=remdm`` on a tiny masked and a tiny block checkpoint: one network
    call per step (a block model: per block step, its blocks sharing the steps)."""
    import re

    from conftest import run_main

    ckpt = request.getfixturevalue(f"tiny_{kind}_checkpoint")
    extra = ["cache=prefix"] if kind == "block" else []
    out = run_main(
        "cdlm-sample",
        f"ckpt={ckpt}",
        "sampler=remdm",
        "sampler.rule.schedule=loop",
        "sampler.rule.eta=0.05",
        "steps=8",
        "num_samples=2",
        *extra,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "sampler=remdm" in out.stdout
    nfe = int(re.search(r"NFE=(\d+)", out.stdout).group(1))
    assert nfe == 8 if kind == "masked" else 0 < nfe <= 8  # one block: every step calls
