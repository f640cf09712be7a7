"""Speculative decoding is lossless: greedy returns exactly the causal pass's greedy tokens, and
sampling follows its AR distribution (an exact computation on a tiny vocabulary)."""

import itertools
import re
from pathlib import Path

import pytest
import torch
from test_block_shift import EOS, MASK, V, networks, shifted

from cdlm.processes.block import BlockProcess
from cdlm.samplers.speculative import accept, leading, sample_speculative

L = 10
CONF = Path(__file__).resolve().parents[1] / "conf"


def block_model(size: int, vocab: int = V, mask: int = MASK):
    process = (
        shifted(size, causal_clean=True, ar_weight=1.0)
        if vocab == V
        else BlockProcess(vocab, mask, size, EOS, shift=True, causal_clean=True, ar_weight=1.0)
    )
    _, net = networks(process)
    return process, process.make_denoiser(net)


def greedy_ar(den, canvas: torch.Tensor) -> torch.Tensor:
    """The causal clean stream decoded greedily, one token per uncached full pass."""
    x = canvas.clone()
    start = int((x == MASK).any(0).long().argmax())
    for i in range(start, x.shape[1]):
        logits = den.next_token_logits(x)[:, i]
        logits[:, MASK] = float("-inf")
        x[:, i] = logits.argmax(-1)
    return x


@pytest.mark.parametrize("size", [1, 2, 4])
@pytest.mark.parametrize("prompt", [0, 3])
def test_greedy_speculative_is_ar_greedy(size, prompt):
    process, den = block_model(size)
    canvas = torch.full((3, L), MASK)
    canvas[:, :prompt] = torch.randint(
        1, V - 1, (3, prompt), generator=torch.Generator().manual_seed(0)
    )
    out = sample_speculative(
        den, canvas, torch.linspace(1, 0, 2), process=process, temperature=0.0, stop_at_eos=False
    )
    assert torch.equal(out.tokens, greedy_ar(den, canvas))
    assert out.stats["accepted_per_call"] > 0 and out.nfe <= 2 * (L - prompt)
    assert out.stats["accepted_per_draft"] <= size


def test_a_full_acceptance_costs_one_call_per_block():
    """An oracle draft (the verifier's own greedy tokens) is always kept: after the first
    draft-only call every call verifies one block and drafts the next."""
    process, den = block_model(2)
    want = greedy_ar(den, torch.full((1, L), MASK))
    canvas = torch.full((1, L), MASK)

    class Oracle:  # drafts the AR greedy tokens, verifies with the real clean stream
        network, parameterize, window_positions = (
            den.network,
            den.parameterize,
            den.window_positions,
        )

        def chunk(self, z, positions, cache=None, start=None):
            real = den.chunk(z, positions, cache, start)
            real.window = torch.full_like(real.window, -1e9).scatter(
                -1, want[:, positions][..., None], 0.0
            )
            return real

    oracle = Oracle()
    oracle.__class__ = type("OracleBlock", (Oracle, type(den)), {})
    out = sample_speculative(
        oracle, canvas, torch.linspace(1, 0, 2), process=process, temperature=0.0, stop_at_eos=False
    )
    assert torch.equal(out.tokens, want)
    assert out.nfe == 1 + L // 2 and out.stats["accepted_per_draft"] == 2.0


def test_the_accept_rule_leaves_the_target_distribution():
    """Exact: P(token) = p(d) min(1, q/p) + P(reject) residual(d) = q(d), checked by Monte
    Carlo at 200k draws per position against the closed form q (5 sigma)."""
    g = torch.Generator().manual_seed(0)
    p = torch.tensor([0.5, 0.3, 0.2, 0.0], dtype=torch.float64)
    q = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    n = 200_000
    draft = torch.multinomial(p.float(), n, replacement=True, generator=g)[None]
    kept, residual = accept(draft, p.expand(1, n, 4), q.expand(1, n, 4), g)
    token = torch.where(kept, draft, residual)[0]
    freq = torch.bincount(token, minlength=4).double() / n
    sigma = (q * (1 - q) / n).sqrt()
    assert bool(((freq - q).abs() < 5 * sigma + 1e-12).all()), (freq, q)
    assert leading(torch.tensor([[True, False, True], [True, True, True]])).tolist() == [1, 3]


def sequence_probability(den, seq: torch.Tensor, temperature: float) -> float:
    """The causal pass's exact probability of ``seq`` (L,) at ``temperature``."""
    logits = den.next_token_logits(seq[None])[0]
    logits[:, -1] = float("-inf")  # the [MASK] column
    logp = (logits.double() / temperature).log_softmax(-1)
    return float(logp.gather(-1, seq[:, None]).sum().exp())


def test_sampling_speculative_follows_the_ar_distribution():
    """Chi-square at 5% over every sequence of 3 tokens from a 3-token vocabulary (+[MASK]),
    block size 2, temperature 0.8, 6000 draws in one batch: the speculative samples are the AR
    model's."""
    vocab, mask, length, draws = 4, 3, 3, 6000
    process, den = block_model(2, vocab, mask)
    canvas = torch.full((draws, length), mask)
    out = sample_speculative(
        den,
        canvas,
        torch.linspace(1, 0, 2),
        process=process,
        generator=torch.Generator().manual_seed(1),
        temperature=0.8,
        stop_at_eos=False,
    )
    seqs = list(itertools.product(range(mask), repeat=length))
    probs = torch.tensor([sequence_probability(den, torch.tensor(s), 0.8) for s in seqs])
    assert abs(float(probs.sum()) - 1.0) < 1e-9
    index = {s: i for i, s in enumerate(seqs)}
    counts = torch.zeros(len(seqs), dtype=torch.float64)
    for row in out.tokens.tolist():
        counts[index[tuple(row)]] += 1
    expected = probs * draws
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    from scipy.stats import chi2 as chi2_dist

    assert chi2 < chi2_dist.ppf(0.95, len(seqs) - 1), chi2


def test_speculative_refuses_what_it_cannot_do():
    process, den = block_model(2)
    canvas = torch.full((1, L), MASK)
    canvas[0, 5] = 4  # a fixed token after the gap: infilling
    with pytest.raises(ValueError, match="left to right") as refused:
        sample_speculative(den, canvas, torch.linspace(1, 0, 2), process=process)
    # the advice names samplers that exist and see later text (not block: it warns it cannot)
    advised = re.findall(r"sampler=(\w+)", str(refused.value))
    assert advised and "block" not in advised
    assert all((CONF / "sampler" / f"{name}.yaml").exists() for name in advised)
    plain = BlockProcess(V, MASK, 2, EOS, shift=True)
    with pytest.raises(ValueError, match="causal_clean=true"):
        sample_speculative(
            plain.make_denoiser(den.network),
            torch.full((1, L), MASK),
            torch.linspace(1, 0, 2),
            process=plain,
        )


def test_a_separate_ar_verifier_gives_its_greedy_tokens():
    """Verifying with a separate AR model (the checkpoint a block model started from) returns
    that model's greedy tokens, at one more call per draft; here the block model's weights have
    drifted from the AR's, so its own causal pass would give other tokens."""
    from test_block_shift import ar_logits

    from cdlm.processes.autoregressive import AutoregressiveProcess

    process = BlockProcess(V, MASK, 2, EOS, shift=True)  # no causal clean stream of its own
    ar, net = networks(process)
    with torch.no_grad():
        for w in net.parameters():
            w.add_(0.05 * torch.randn_like(w))
    predictor = AutoregressiveProcess(V, EOS).make_denoiser(ar)
    canvas = torch.full((2, L), MASK)
    out = sample_speculative(
        process.make_denoiser(net),
        canvas,
        torch.linspace(1, 0, 2),
        process=process,
        temperature=0.0,
        stop_at_eos=False,
        verifier=predictor,
    )
    want = canvas.clone()
    for i in range(L):
        logits = ar_logits(ar, want)[:, i]
        logits[:, MASK] = float("-inf")
        want[:, i] = logits.argmax(-1)
    assert torch.equal(out.tokens, want)
    assert out.nfe >= 2 * out.stats["drafts"]
