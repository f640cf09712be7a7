"""Gaussian diffusion with posterior (soft-token) input, shifted prediction and an AR phase."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from cdlm.denoiser import readout_evidence
from cdlm.networks.transformer import Transformer
from cdlm.processes import GaussianProcess
from cdlm.processes.inputs import PosteriorInput, VectorInput
from cdlm.processes.objectives import X0MSE, CrossEntropy
from cdlm.training.phases import Phases


def small(proc: GaussianProcess, **kw) -> Transformer:
    return Transformer(
        **proc.network_kwargs, d_model=16, n_layers=2, n_heads=2, max_seq_len=9, **kw
    )


def test_one_hot_soft_tokens_embed_exactly_as_ids():
    torch.manual_seed(0)
    net = Transformer(out_dim=7, in_vocab=7, self_condition=False, d_model=16, n_heads=2)
    ids = torch.randint(0, 7, (2, 5))
    t = torch.rand(2)
    torch.testing.assert_close(net(F.one_hot(ids, 7).float(), t), net(ids, t))
    mix = torch.full((2, 5, 7), 1 / 7)  # a uniform distribution reads as the mean embedding
    h = mix @ net.in_proj.weight
    torch.testing.assert_close(h[0, 0], net.in_proj.weight.mean(0))


def test_readout_evidence_is_the_gaussian_log_likelihood_up_to_a_constant():
    torch.manual_seed(0)
    proc = GaussianProcess(20, embed_dim=6)
    ids = torch.randint(0, 20, (2, 4))
    t = torch.tensor([0.3, 0.8])
    x_t = proc.noised(proc.embedding(ids), t, torch.randn(2, 4, 6))
    ev = readout_evidence(proc.embedding, proc.schedule, x_t, t)
    a, s = proc.schedule.alpha(t)[:, None, None, None], proc.schedule.sigma(t)[:, None, None, None]
    table = proc.embedding.table()
    exact = -((x_t[:, :, None] - a * table) ** 2).sum(-1) / (2 * s[..., 0] ** 2)
    torch.testing.assert_close(
        ev - ev[..., :1], exact - exact[..., :1], atol=1e-3, rtol=1e-4
    )  # log N(x; alpha e_v, sigma^2) differences between tokens


@pytest.mark.parametrize("shift", [False, True])
def test_posterior_input_at_low_noise_is_the_clean_token_input(shift):
    """At the lowest noise level the no-context posterior is one-hot on the true token, so the
    network sees exactly what a token-input network sees on clean text (with ``shift``: after a
    BOS, the layout of an AR network)."""
    torch.manual_seed(0)
    proc = GaussianProcess(20, embed_dim=8, input=PosteriorInput(shift=shift), eos_id=3).eval()
    net = small(proc).eval()
    ids = torch.randint(0, 20, (2, 8))
    t = torch.zeros(2)
    x_t = proc.noised(proc.embedding(ids), t, torch.randn(2, 8, 8))
    got = proc.make_denoiser(net)(x_t, t).logits  # no readout skip: the network's own
    inputs = torch.cat([torch.full((2, 1), 3), ids], 1) if shift else ids
    expected = net(inputs, t)[:, :-1] if shift else net(inputs, t)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    # ... and at high noise it is a soft token, not the clean one
    t1 = torch.full((2,), 0.95)
    x1 = proc.noised(proc.embedding(ids), t1, torch.randn(2, 8, 8))
    seen = []
    proc.make_denoiser(lambda x, t, sc, label=None: seen.append(x) or net(x, t))(x1, t1)
    probs = seen[0][:, 1:] if shift else seen[0]
    assert probs.shape == (2, 8, 20) and probs.max() < 0.9
    torch.testing.assert_close(probs.sum(-1), torch.ones(2, 8))


def test_gaussian_ar_phase_then_annealing_then_diffusion():
    """The Phases callback drives the schedule from the budget share: with 8 steps, ar=0.25
    and anneal=0.25, batches 0-1 are AR (visibility 0), then attention opens over batches 2-4
    (visibility (p - 0.25) / 0.25 at p = step / 8), then plain diffusion."""
    torch.manual_seed(0)
    proc = GaussianProcess(
        12,
        embed_dim=8,
        input=PosteriorInput(shift=True),
        objective=CrossEntropy(readout_skip=True),
        eos_id=1,
    ).train()
    net = small(proc)
    den = proc.make_denoiser(net)
    tokens = torch.randint(0, 12, (3, 8))
    phases, module = Phases(ar=0.25, anneal=0.25), SimpleNamespace(process=proc, network=net)
    trainer = SimpleNamespace(max_steps=8, global_step=0, callbacks=[])
    phases.setup(trainer, module, "fit")
    seen = []
    for step in range(5):
        trainer.global_step = step
        phases.on_train_batch_start(trainer, module, None, step)
        out = proc.loss(den, {"tokens": tokens})
        seen.append((sorted(out.metrics), net.future_visibility))
    assert [m for m, _ in seen] == [["ar_bits_per_token"]] * 2 + [["ce"]] * 3
    assert [v for _, v in seen] == [0.0, 0.0, 0.0, 0.5, 1.0]
    phases.on_train_end(trainer, module)  # the trained model is left a diffusion model
    assert not proc.ar_phase and net.future_visibility == 1.0
    # the AR phase loss is the next-token NLL of the causal network on clean tokens
    net.causal = True
    logits = net(torch.cat([torch.full((3, 1), 1), tokens], 1), torch.zeros(3))[:, :-1]
    net.causal = False
    expected = F.cross_entropy(logits.flatten(0, 1), tokens.flatten())
    proc.ar_phase, net.future_visibility = True, 0.0  # what Phases sets in the AR phase
    torch.testing.assert_close(
        proc.loss(den, {"tokens": tokens}).loss, expected, atol=1e-5, rtol=1e-5
    )
    assert proc.loss(den, {"tokens": tokens}).metrics["ar_bits_per_token"] == pytest.approx(
        expected.item() / math.log(2), rel=1e-5
    )
    assert proc.ar_phase and net.future_visibility == 0.0  # loss advanced nothing
    # PAD (valid=False) is left out of the AR loss too
    valid = torch.ones(3, 8, dtype=torch.bool)
    valid[0, 6:] = valid[2, 3:] = False
    padded = proc.loss(den, {"tokens": tokens, "valid": valid}).loss
    torch.testing.assert_close(
        padded, F.cross_entropy(logits[valid], tokens[valid]), atol=1e-5, rtol=1e-5
    )
    # a class-conditional run's labels reach the network in the AR phase too
    from cdlm.guidance import WithLabel

    labelled = small(proc, num_classes=2)
    for p in labelled.parameters():  # adaLN-Zero starts label-blind: wake every layer up
        torch.nn.init.normal_(p, std=0.3)
    labelled.future_visibility = 0.0
    plain = proc.loss(proc.make_denoiser(labelled), {"tokens": tokens}).loss
    bound = WithLabel(proc.make_denoiser(labelled), torch.ones(3, dtype=torch.long))
    assert not torch.allclose(proc.loss(bound, {"tokens": tokens}).loss, plain)


def test_posterior_input_refuses_what_it_cannot_do():
    """A shift without a posterior input cannot be asked for (``VectorInput`` takes no shift);
    a posterior input is not self-conditioned unless asked (``self_cond_prob``, see
    tests/test_self_cond_posterior.py) and composes with either objective; a shift still needs
    its BOS, and an AR phase a shift."""
    ids = torch.randint(0, 10, (2, 6))
    proc = GaussianProcess(10, embed_dim=4, input=PosteriorInput()).train()
    assert proc.input.self_cond_prob == 0 and not proc.network_kwargs["self_condition"]
    net = small(proc)
    den, calls = proc.make_denoiser(net), []

    def counting(x_t, t, self_cond=None):
        calls.append(self_cond)
        return den(x_t, t, self_cond)

    proc.loss(counting, {"tokens": ids})
    assert calls == [None]  # one pass, never self-conditioned, even in training
    with pytest.raises(ValueError, match="self_cond_prob"):
        PosteriorInput(self_cond_prob=1.5)
    with pytest.raises(TypeError):
        VectorInput(shift=True)
    # what used to be refused (objective=mse) composes now: soft tokens in, x0 out
    mse = GaussianProcess(10, embed_dim=4, input=PosteriorInput(), objective=X0MSE()).train()
    assert mse.network_kwargs == {"in_vocab": 10, "self_condition": False, "out_dim": 4}
    mse_den = mse.make_denoiser(small(mse))
    assert mse_den(torch.randn(2, 6, 4), torch.rand(2)).x0.shape == (2, 6, 4)
    assert torch.isfinite(mse.loss(mse_den, {"tokens": ids}).loss)
    with pytest.raises(ValueError, match="needs eos_id"):
        GaussianProcess(10, input=PosteriorInput(shift=True))
    with pytest.raises(ValueError, match="token_noise > 0 needs input=posterior"):
        GaussianProcess(10, token_noise=0.5)
    GaussianProcess(10, input=PosteriorInput(), token_noise=0.5)  # it tells each token's level
    # an AR phase needs the shifted layout: refused by the callback, and by the loss itself
    with pytest.raises(ValueError, match="AR phase needs the next-token layout"):
        Phases(ar=0.3).setup(None, SimpleNamespace(process=proc, network=net), "fit")
    proc.ar_phase = True
    with pytest.raises(ValueError, match="AR phase needs a shifted input"):
        proc.loss(den, {"tokens": ids})


def test_posterior_input_model_trains_and_samples_from_the_cli(tmp_path_factory, tiny_corpus):
    from tests.conftest import run_main, train_tiny

    ckpt = train_tiny(
        tmp_path_factory,
        tiny_corpus,
        "process.embed_dim=8",
        "input@process.input=posterior",
        "process.input.shift=true",
        "phases.ar=0.3",
        "phases.anneal=0.3",
    )
    out = tmp_path_factory.mktemp("samples") / "s.jsonl"
    result = run_main(
        "cdlm-sample",
        f"ckpt={ckpt}",
        "num_samples=2",
        "steps=4",
        "seed=0",
        f"out={out}",
        'infill="It was [[4]] truth"',
        cwd=out.parent,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = out.read_text().splitlines()
    assert len(lines) == 2
    assert all('"text": "It was' in ln for ln in lines)


def test_markov_marginals_match_brute_force_enumeration():
    import itertools

    from cdlm.evaluation.oracle import bigram_transition, markov_marginals

    torch.manual_seed(0)
    v, length = 3, 4
    transition = torch.softmax(torch.randn(v, v), -1)
    initial = torch.softmax(torch.randn(v), -1)
    log_em = torch.randn(2, length, v) * 2
    log_em[1, 2] = torch.tensor([0.0, -math.inf, -math.inf])  # an observed token
    exact = torch.zeros(2, length, v)
    for b in range(2):
        for seq in itertools.product(range(v), repeat=length):
            p = initial[seq[0]] * log_em[b, 0, seq[0]].exp()
            for i in range(1, length):
                p = p * transition[seq[i - 1], seq[i]] * log_em[b, i, seq[i]].exp()
            for i, s in enumerate(seq):
                exact[b, i, s] += p
    exact = exact / exact.sum(-1, keepdim=True)
    torch.testing.assert_close(markov_marginals(log_em, transition, initial), exact)
    counts = bigram_transition(torch.tensor([[0, 1, 0, 1, 2]]), 3, strength=0.0)
    torch.testing.assert_close(counts[0], torch.tensor([0.0, 1.0, 0.0]))
    torch.testing.assert_close(counts[1], torch.tensor([0.5, 0.0, 0.5]))


def test_bigram_oracle_uses_context_where_the_readout_cannot():
    """On text from a deterministic cycle 0 -> 1 -> 2 -> 0, the exact bigram denoiser decodes
    masked tokens next to visible ones, where the no-context readout is the unigram guess."""
    from cdlm.evaluation.levels import level_metrics
    from cdlm.evaluation.oracle import bigram_transition
    from cdlm.processes import MaskedProcess

    tokens = torch.arange(64).remainder(3).view(4, 16)
    proc = MaskedProcess(4, mask_id=3)
    transition = bigram_transition(tokens, 4, strength=0.01)
    prior = torch.tensor([1 / 3, 1 / 3, 1 / 3 - 1e-6, 1e-6]).log()

    def uniform(z, t):
        from cdlm.denoiser import Prediction

        return Prediction(logits=torch.zeros(*z.shape, 4))

    ev = proc.evaluate_at(uniform, tokens, 0.5, torch.Generator().manual_seed(0))
    m = level_metrics(ev, prior, transition)
    assert m.oracle_acc > 0.95 and m.baseline_acc < 0.5
