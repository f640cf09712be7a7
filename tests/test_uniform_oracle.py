"""The uniform-state oracle (``cdlm.worlds.uniform``) against enumeration in float64, and uniform
decoding on it against the world's exact distribution over whole sequences."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch
from test_worlds import (
    brute_posterior,
    chi_square_p,
    draw,
    enumerate_world,
    process_cfg,
    tiny_world,
)

from cdlm.model_file import oracle_model
from cdlm.processes.uniform import uniform_nelbo
from cdlm.samplers.uniform import uniform_posterior

LENGTH = 3
STATES = 3  # the tiny world's symbols (ids 3..5): the noise's support, its specials left out


def noisy_case(world, seed: int = 0):
    """A batch of uniform corruptions of exact samples at several levels: x_t (B, L), t (B,)."""
    g = torch.Generator().manual_seed(seed)
    t = torch.tensor([0.05, 0.3, 0.6, 0.9, 0.999])
    model = oracle_model(world, process_cfg("uniform"))
    assert model.process.support.ids.tolist() == [3, 4, 5]
    x_t = model.process.corrupt(world.sample(len(t), LENGTH, g), t, g).x_t
    return model, x_t, t


def evidence_by_hand(x_t: torch.Tensor, alpha: float, vocab: int) -> torch.Tensor:
    """(L, V) log q(x_t^j | x0^j = v) for one row, float64: the noise draws from the STATES
    symbols (off them the world's zero prior cancels whatever value)."""
    ev = torch.full((len(x_t), vocab), (1 - alpha) / STATES, dtype=torch.float64)
    ev[torch.arange(len(x_t)), x_t] += alpha
    return ev.log()


def test_uniform_oracle_is_the_leave_one_out_posterior():
    """x0_hat^i = p(x0^i | x_t at every other position), each noisy token read as the evidence
    alpha [v = x_t] + (1 - alpha) / K: by enumeration of the world's sequences."""
    world = tiny_world(length=LENGTH)
    seqs, p = enumerate_world(world, LENGTH)
    model, x_t, t = noisy_case(world)
    got = model.denoiser(x_t, t).logits.double().exp()
    alphas = model.process.keep(t.double())[:, 0]
    for b in range(len(t)):
        ev = evidence_by_hand(x_t[b], float(alphas[b]), world.vocab_size)
        for i in range(LENGTH):
            others = ev.clone()
            others[i] = 0.0  # position i's own evidence left out
            want = brute_posterior(seqs, p, others)[i]
            assert torch.allclose(got[b, i], want, atol=2e-6), (b, i)


def test_the_plug_in_step_on_the_oracle_is_the_exact_per_token_reverse_step():
    """The derivation of ``cdlm.worlds.uniform``: q(x_s | x_t, x0_hat) with the oracle's x0_hat
    equals p(x_s^i | x_t) = sum_v q(x_s^i | x_t^i, x0^i = v) p(x0^i = v | x_t) by enumeration,
    at s > 0 and at s = 0 (where it is the full posterior p(x0^i | x_t))."""
    world = tiny_world(length=LENGTH)
    seqs, p = enumerate_world(world, LENGTH)
    model, x_t, t = noisy_case(world, seed=1)
    vocab = world.vocab_size
    x0_hat = model.denoiser(x_t, t).logits.double().exp()
    a_t = model.process.keep(t.double())[:, 0]
    for a_s in (torch.full_like(a_t, 1.0), (a_t + 1) / 2):
        step = uniform_posterior(x0_hat, x_t, a_s, a_t, model.process.support.mask)
        for b in range(len(t)):
            full = brute_posterior(seqs, p, evidence_by_hand(x_t[b], float(a_t[b]), vocab))
            a = float(a_t[b] / a_s[b])  # s -> t keeps a token with probability a
            back = torch.full((vocab,), (1 - a) / STATES, dtype=torch.float64)
            on = (torch.arange(vocab) >= vocab - STATES).double()  # the support, the symbols
            for i in range(LENGTH):
                back_i = back.clone()
                back_i[x_t[b, i]] += a  # q(x_t^i | x_s^i = w)
                eye = torch.eye(vocab, dtype=torch.float64)
                a_sb = float(a_s[b])
                forward = a_sb * eye + (1 - a_sb) * on / STATES  # q(x_s = w | x0 = v)
                bayes = forward * back_i[None]  # rows v: q(x_s = w | x_t^i, x0 = v), unnormalised
                bayes = bayes / bayes.sum(-1, keepdim=True)
                want = full[i] @ bayes
                assert torch.allclose(step[b, i], want, atol=5e-6), (b, i)


def test_the_uniform_elbo_of_the_oracle_is_the_worlds_entropy():
    """The ELBO's route to the same answer: with the oracle's x0_hat, the continuous-time
    uniform ELBO (``uniform_nelbo``), integrated over t in (0, 1] and averaged over every x0
    and x_t, equals H(x0): the exact reverse rates make the bound tight. The full posterior in
    its place is 1.1 nats above."""
    world = tiny_world(length=LENGTH)
    seqs, p = enumerate_world(world, LENGTH)
    model = oracle_model(world, process_cfg("uniform"))
    support = model.process.support
    noisy = torch.tensor(list(itertools.product(support.ids.tolist(), repeat=LENGTH)))
    x0, x_t = seqs.repeat_interleave(len(noisy), 0), noisy.repeat(len(seqs), 1)
    p0 = p.repeat_interleave(len(noisy))
    nodes, weights = np.polynomial.legendre.leggauss(48)
    lo = np.log(1e-7)  # the process's t_min = 1e-3 leaves out 0.011 nats here
    bound = 0.0
    for u, w in zip((nodes + 1) / 2 * -lo + lo, weights * -lo / 2, strict=True):
        t = torch.full((len(x_t),), float(np.exp(u)), dtype=torch.float64)
        a, da = model.process.schedule.keep(t), model.process.schedule.dkeep(t)
        q = (a[:, None] * (x_t == x0) + (1 - a[:, None]) / STATES).prod(-1)  # q(x_t | x0)
        logp = model.denoiser(x_t, t.float()).logits.double()
        per = uniform_nelbo(logp, x_t, x0, a, da, support.mask).sum(-1)
        bound += w * float(t[0]) * float((p0 * q * per).sum())
    assert bound == pytest.approx(world.entropy(LENGTH), abs=1e-4)


@pytest.mark.parametrize("sampler", ["duo_ancestral", "duo_psi"])
def test_uniform_decoding_on_its_oracle_samples_the_world(sampler):
    """With the last step drawn, uniform decoding at many steps draws the world's sequences
    (chi-square over all 27); the greedy last step does not."""
    world = tiny_world(length=LENGTH)
    model = oracle_model(world, process_cfg("uniform"))
    assert chi_square_p(world, draw(model, sampler, 64, 3000, LENGTH)) > 0.05
    greedy = draw(model, sampler, 64, 3000, LENGTH, last_step="greedy")
    assert chi_square_p(world, greedy) < 1e-6


def test_a_bad_last_step_is_named():
    world = tiny_world(length=LENGTH)
    model = oracle_model(world, process_cfg("uniform"))
    with pytest.raises(ValueError, match="unknown last_step 'sample'"):
        draw(model, "duo_ancestral", 4, 2, LENGTH, last_step="sample")


def test_cdlm_sample_decodes_a_world_under_uniform_noise(tmp_path):
    """``cdlm-sample ckpt=world:chars process=uniform``: the world's own letters, no special
    token (the oracle gives them no mass, so the drawn last step never lands on one)."""
    from conftest import run_main

    out = tmp_path / "s.jsonl"
    args = ["process=uniform", "steps=8", "num_samples=4", "seq_len=16", f"out={out}"]
    result = run_main("cdlm-sample", "ckpt=world:chars", *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    ids = torch.tensor([json.loads(line)["token_ids"] for line in out.read_text().splitlines()])
    assert ids.shape == (4, 16) and int(ids.min()) >= 3
