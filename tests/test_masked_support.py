"""process=masked's and block's support (``cdlm.processes.support``, issue 51): x0_hat puts no
mass on the specials the data never holds, so no sampler can draw one even from a network that
favours them; the data decides the set; the bound is unchanged where the network already gave
them none; old model files keep only [MASK] out."""

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from cdlm.configs import compose
from cdlm.generation import named_sampler
from cdlm.model import build
from cdlm.networks.transformer import Transformer
from cdlm.processes.block import BlockProcess
from cdlm.processes.masked import MaskedProcess
from cdlm.processes.vocabulary import token_ids
from cdlm.samplers import SAMPLERS, uniform_grid

V, EOS, PAD, MASK = 12, 0, 1, 11
OUT = [EOS, PAD]  # a world's: it packs no EOS and pads nothing
B, L = 4, 8
STEPS = L  # exact_k's k = 1 needs a step per position


def process_of(kind: str, excluded: list[int]) -> nn.Module:
    """A float64 process of ``kind``; block in the layout speculative decoding verifies with."""
    if kind == "masked":
        return MaskedProcess(V, MASK, EOS, shift=True, excluded=excluded).double().eval()
    return (
        BlockProcess(V, MASK, 4, EOS, shift=True, causal_clean=True, excluded=excluded)
        .double()
        .eval()
    )


def loves_specials(process: nn.Module) -> Transformer:
    """A tiny seeded Transformer whose outputs favour EOS, PAD and [MASK] by e^8: what a model
    that never learnt to avoid them would do at its worst."""
    torch.manual_seed(0)
    network = Transformer(
        **process.network_kwargs, d_model=16, n_layers=1, n_heads=2, max_seq_len=32
    ).double()
    boost = torch.zeros(V, dtype=torch.float64)
    boost[[*OUT, MASK]] = 8.0
    network.register_forward_hook(lambda module, args, out: out + boost)
    return network.eval()


def sampled_ids(kind: str, name: str, excluded: list[int]) -> torch.Tensor:
    """Every id on the canvas through a run of sampler ``name``, its final state included."""
    process = process_of(kind, excluded)
    denoiser = process.sampling_denoiser(loves_specials(process))
    generator = torch.Generator().manual_seed(3)
    seen = []
    x = process.prior((B, L), torch.device("cpu"), generator)
    out = named_sampler(name)(
        denoiser, x, uniform_grid(STEPS), process=process, generator=generator,
        callback=lambda step: seen.append(step.x),
    )  # fmt: skip
    assert not bool((out.x == MASK).any()), f"{name} left a [MASK]"
    return torch.cat([s.reshape(-1) for s in [*seen, out.x]])


RUNS = [
    (kind, name)
    for name, kinds in SAMPLERS.items()
    for kind in ("masked", "block")
    if kind in kinds
]


@pytest.mark.parametrize(("kind", "name"), RUNS)
def test_no_excluded_id_can_be_drawn(kind: str, name: str):
    """Every sampler of the masked and block processes, from a network that favours the
    excluded ids, decides the canvas with none of them."""
    ids = sampled_ids(kind, name, OUT)
    assert not bool(torch.isin(ids, torch.tensor(OUT)).any()), "an excluded id was drawn"


def test_without_the_support_the_same_network_draws_them():
    """With ``excluded=[]`` (model files from before the support) the same runs do draw EOS
    and PAD: what the support takes away, and a check that the network above can draw them."""
    for kind, name in (("masked", "ancestral"), ("block", "block"), ("block", "speculative")):
        assert bool(torch.isin(sampled_ids(kind, name, []), torch.tensor(OUT)).any()), name


def test_the_bound_is_unchanged_where_the_network_gave_the_specials_no_mass():
    """The ELBO on data inside the support reads the softmax over the support: for a network
    that already gives the excluded ids (almost) no mass it is the whole vocabulary's bound."""
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(2, MASK, (B, L), generator=g)
    for kind in ("masked", "block"):
        losses = []
        for excluded in ([], OUT):
            process = process_of(kind, excluded)
            network = loves_specials(process)
            network.register_forward_hook(lambda m, a, out: out.index_fill(-1, OUT_IDS, -1e30))
            denoiser = process.make_denoiser(network)
            losses.append(process.loss(denoiser, {"tokens": tokens}, torch.Generator()))
        assert losses[1].loss.item() == pytest.approx(losses[0].loss.item(), rel=1e-12)


OUT_IDS = torch.tensor(OUT)


def test_training_tokens_outside_the_support_are_refused():
    process = process_of("masked", OUT)
    denoiser, g = process.make_denoiser(loves_specials(process)), torch.Generator()
    tokens = torch.randint(2, MASK, (2, L), generator=g.manual_seed(0))
    tokens[1, -2:] = PAD  # at unscored positions: allowed
    valid = torch.ones(2, L, dtype=torch.bool)
    valid[1, -2:] = False
    assert torch.isfinite(process.loss(denoiser, {"tokens": tokens, "valid": valid}, g).loss)
    with pytest.raises(ValueError, match="token id 1 is in the data but outside process=masked"):
        process.loss(denoiser, {"tokens": tokens}, g)
    with pytest.raises(ValueError, match=r"ids \[12\] are outside the vocabulary of 12"):
        MaskedProcess(V, MASK, excluded=[12])


@pytest.mark.parametrize("name", ["masked", "block"])
def test_the_data_decides_the_support(name: str):
    """``excluded`` is filled in from the tokenizer and what the data holds: a world's rows
    hold no special, text's hold EOS; a stored config without the key (a model file from
    before) keeps only [MASK] out."""
    from cdlm import worlds

    tokenizer = worlds.load("world:chars").tokenizer
    cfg = compose("train", [f"process={name}"]).process
    assert token_ids(cfg, tokenizer, held=())["excluded"] == sorted(tokenizer.all_special_ids)
    text = token_ids(cfg, tokenizer, held=[tokenizer.eos_token_id])["excluded"]
    assert text == sorted({tokenizer.pad_token_id, tokenizer.mask_token_id})
    stored = OmegaConf.to_container(cfg, resolve=False) | token_ids(cfg, tokenizer)
    stored.pop("excluded")
    stored = OmegaConf.to_container(OmegaConf.create({"process": stored, "mask_schedule": {
        "_target_": "cdlm.schedules.LogLinearMaskSchedule"}}), resolve=True)  # fmt: skip
    old = build(None, stored, "process")
    assert old.support.out.tolist() == [tokenizer.mask_token_id]
