"""The fixed-shape AR decode step (``sampler.fixed_shape``, ``cdlm.networks.fixed_cache``): every
one-token call attends over the whole preallocated buffer with a mask of the written slots, so a
CUDA graph can replay it (``sampler.graph``, tests/test_cuda.py). On the CPU it must draw the
tokens the growing cache draws, with a prompt's prefill, per-row generators and a stop at EOS,
and its logits must be the growing cache's up to float rounding."""

from __future__ import annotations

import pytest
import torch

from cdlm import rng
from cdlm.networks.transformer import Transformer
from cdlm.processes.autoregressive import AutoregressiveProcess
from cdlm.samplers import uniform_grid
from cdlm.samplers.autoregressive import sample_ar

V, L, BOS = 61, 24, 60


def network(causal: bool = True) -> Transformer:
    """A small causal Transformer moved off the adaLN-Zero identity start (attention matters)."""
    torch.manual_seed(0)
    net = Transformer(
        out_dim=V, in_vocab=V, d_model=32, n_layers=2, n_heads=4, max_seq_len=L + 8,
        self_condition=False, causal=causal,
    )  # fmt: skip
    with torch.no_grad():
        for p in net.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return net.eval()


def decode(den, process, batch: int, generator, **options):
    x = process.prior((batch, L), torch.device("cpu"), None)
    steps = []
    out = sample_ar(
        den, x, uniform_grid(1), process=process, generator=generator,
        callback=lambda info: steps.append(info.prediction.logits[:, -1]), **options,
    )  # fmt: skip
    return out, torch.stack(steps)


@pytest.mark.parametrize("stop_at_eos", [False, True])
def test_the_fixed_step_draws_the_growing_caches_tokens(stop_at_eos):
    process = AutoregressiveProcess(vocab_size=V, bos_id=BOS)
    den = process.make_denoiser(network())
    runs = [
        decode(den, process, 5, rng.generator(3), stop_at_eos=stop_at_eos, fixed_shape=fixed)
        for fixed in (False, True, True)  # the second fixed decode reuses the network's cache
    ]
    (growing, logits), (fixed, fixed_logits), (again, _) = runs
    assert torch.equal(fixed.tokens, growing.tokens) and torch.equal(again.tokens, fixed.tokens)
    assert fixed.nfe == growing.nfe and fixed.positions == growing.positions
    assert len(set(growing.tokens.flatten().tolist())) > 10  # the draws are not degenerate
    torch.testing.assert_close(fixed_logits, logits, rtol=0, atol=1e-5)


def test_a_prompt_prefills_the_fixed_cache_and_rows_keep_their_streams():
    """Prompts of different lengths (``ForcePrefix``): one prefill of the shared part, then rows
    that draw from their own generators (``rng.Rows``), as with the growing cache."""
    process = AutoregressiveProcess(vocab_size=V, bos_id=BOS)
    base = process.make_denoiser(network())
    ids = torch.randint(0, V - 1, (3, L), generator=torch.Generator().manual_seed(1))
    editable = torch.ones(3, L, dtype=torch.bool)
    for row, n in enumerate((4, 7, 5)):
        editable[row, :n] = False
    den = process.hold_fixed(base, ids, editable, None)
    outs = []
    for fixed in (False, True):
        rows = rng.Rows([rng.generator(s) for s in (4, 5, 6)], [L] * 3)
        outs.append(decode(den, process, 3, rows, stop_at_eos=False, fixed_shape=fixed)[0])
    assert torch.equal(outs[1].tokens, outs[0].tokens)
    assert torch.equal(outs[1].tokens[~editable], ids[~editable])  # the prompts are kept
    assert outs[1].nfe == L - 3  # one prefill of the 3 shared prompt tokens, then a call a token


def test_the_graph_is_refused_off_cuda_and_the_fixed_cache_off_causal_networks():
    process = AutoregressiveProcess(vocab_size=V, bos_id=BOS)
    den = process.make_denoiser(network())
    x = process.prior((2, L), torch.device("cpu"), None)
    with pytest.raises(ValueError, match=r"^sampler.graph=true .* needs a CUDA device; the model"):
        sample_ar(den, x, uniform_grid(1), process=process, graph=True)
    with pytest.raises(ValueError, match="decode with the KV cache"):
        sample_ar(den, x, uniform_grid(1), process=process, fixed_shape=True, use_cache=False)
    with pytest.raises(ValueError, match="causal"):
        network(causal=False).new_fixed_cache(2, L)
    cache = den.new_fixed_cache(2, L)
    with pytest.raises(ValueError, match="does not fit a fixed cache of 2 rows"):
        den(torch.zeros(3, 1, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match=f"2 x {L + 1} does not fit .* {L} of {L} positions left"):
        den(torch.zeros(2, L + 1, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="longer than this network's max_seq_len"):
        den.new_fixed_cache(2, 10 * L)
