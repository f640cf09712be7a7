"""Fill-in-the-middle for the AR baseline: formatting round-trips, the training transform keeps
every token of the document it cuts, validation stays plain NLL, and the sampler writes each
gap after the prompt of its two sides (an oracle that reads that prompt infills exactly)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from cdlm.denoiser import NetworkDenoiser, Prediction
from cdlm.networks.transformer import Transformer
from cdlm.processes import AutoregressiveProcess, fim
from cdlm.processes.autoregressive import NextTokenPredictor
from cdlm.samplers.autoregressive import sample_ar

V = 40
IDS = fim.FimIds(36, 37, 38, 39)
BOS = 35


def test_psm_and_spm_formats_hold_the_document_in_their_orders():
    doc = torch.arange(10)
    psm = fim.format_document(doc, (3, 7), IDS, "psm")
    assert psm.tolist() == [36, 0, 1, 2, 37, 7, 8, 9, 38, 3, 4, 5, 6, 39]
    spm = fim.format_document(doc, (3, 7), IDS, "spm")
    assert spm.tolist() == [36, 37, 7, 8, 9, 38, 0, 1, 2, 3, 4, 5, 6, 39]
    for cuts in [(0, 0), (0, 10), (10, 10), (4, 4), (2, 9)]:
        prefix, suffix, middle = fim.parse(fim.format_document(doc, cuts, IDS, "psm"), IDS)
        assert torch.equal(torch.cat([prefix, middle, suffix]), doc)
        assert middle.shape[0] == cuts[1] - cuts[0]
    with pytest.raises(ValueError, match="do not lie"):
        fim.format_document(doc, (5, 11), IDS, "psm")
    with pytest.raises(ValueError, match="'psm' or 'spm'"):
        fim.prompt(doc[:2], doc[2:], IDS, "msp")
    with pytest.raises(ValueError, match="4 distinct ids"):
        fim.FimIds.of([1, 1, 2, 3])


def test_transform_formats_its_share_of_rows_and_keeps_every_token_of_what_it_cuts():
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 30, (400, 16), generator=g)
    valid = torch.ones_like(tokens, dtype=torch.bool)
    out, kept = fim.transform(tokens, valid, 0.5, 0.5, IDS, BOS, g)
    formatted = out[:, 0] == IDS.prefix
    assert 0.4 < formatted.float().mean() < 0.6
    assert torch.equal(out[~formatted], tokens[~formatted]) and kept[~formatted].all()
    spm = 0
    for row in torch.nonzero(formatted).flatten().tolist():
        assert kept[row].all()  # 12 tokens and 4 sentinels fill the row
        seq = out[row]
        assert seq[-1] == IDS.end and sorted(seq[seq < 30].tolist()) == sorted(
            tokens[row, :12].tolist()
        )
        spm += int(seq[1] == IDS.suffix)
    assert 0.35 < spm / int(formatted.sum()) < 0.65
    short = valid.clone()
    short[:, 10:] = False  # a padded row: only its valid tokens are cut
    out, kept = fim.transform(tokens[:4], short[:4], 1.0, 0.0, IDS, BOS, g)
    assert kept.sum(1).tolist() == [14] * 4 and (out[:, 14:] == BOS).all()
    prefix, suffix, middle = fim.parse(out[0, :14], IDS)
    assert torch.equal(torch.cat([prefix, middle, suffix]), tokens[0, :10])


def test_fim_trains_on_formatted_rows_and_validates_on_plain_text():
    torch.manual_seed(0)
    process = AutoregressiveProcess(V, BOS, fim_rate=1.0, fim_ids=IDS.as_list())
    net = Transformer(**process.network_kwargs, d_model=16, n_layers=1, n_heads=2, max_seq_len=17)
    plain = AutoregressiveProcess(V, BOS)
    batch = {"tokens": torch.randint(0, 30, (4, 16))}
    denoiser = process.make_denoiser(net)
    trained = process.train().loss(denoiser, batch).loss
    scored = process.eval().loss(denoiser, batch).loss
    assert torch.allclose(scored, plain.eval().loss(denoiser, batch).loss)
    assert not torch.allclose(trained, scored)
    with pytest.raises(ValueError, match="needs fim_ids"):
        AutoregressiveProcess(V, BOS, fim_rate=0.5)
    with pytest.raises(ValueError, match=r"fim_rate must be in \[0, 1\]"):
        AutoregressiveProcess(V, BOS, fim_rate=1.5, fim_ids=IDS.as_list())


class Reader(NetworkDenoiser):
    """An AR denoiser that knows the document: after a PSM prompt it predicts the middle's
    next token, read off the prompt's prefix length; it records each gap's prompt (the input
    that ends with the middle sentinel)."""

    def __init__(self, doc: torch.Tensor) -> None:
        self.doc, self.bos_id, self.calls, self.prompts = doc, BOS, 0, []
        self.network = SimpleNamespace(new_cache=list)

    def __call__(self, tokens, t=None, self_cond=None, cache=None, **kw) -> Prediction:
        if cache is not None:
            cache.append(tokens)
            tokens = torch.cat(cache, 1)
        self.calls += 1
        logits = torch.zeros(tokens.shape[0], tokens.shape[1], V)
        for row, seq in enumerate(tokens.tolist()):
            a, mid = seq.index(IDS.suffix) - 2, seq.index(IDS.middle)
            if mid == len(seq) - 1 and row == 0:
                self.prompts.append(seq)
            logits[row, -1, self.doc[a + len(seq) - mid - 1]] = 50.0  # a sure draw at T=1
        return Prediction(logits=logits)


@pytest.mark.parametrize("use_cache", [True, False])
def test_the_sampler_fills_each_gap_from_both_sides_and_counts_its_calls(use_cache):
    doc = torch.arange(20)
    editable = torch.zeros(2, 20, dtype=torch.bool)
    editable[:, 3:7] = editable[:, 12:15] = True
    ids = torch.where(editable, 0, doc)
    reader = Reader(doc)
    process = AutoregressiveProcess(V, BOS, fim_rate=0.5, fim_ids=IDS.as_list())
    held = process.hold_fixed(reader, ids, editable, None)
    assert held.gaps() == [(3, 7), (12, 15)]
    out = sample_ar(held, ids, torch.ones(1), process=process, use_cache=use_cache)
    assert torch.equal(out.tokens, doc.expand(2, -1))
    # the prefix is the canvas before the gap (the first gap filled); the suffix the fixed
    # text up to the next gap
    first = [BOS, IDS.prefix, 0, 1, 2, IDS.suffix, 7, 8, 9, 10, 11, IDS.middle]
    second = [BOS, IDS.prefix, *range(12), IDS.suffix, *range(15, 20), IDS.middle]
    assert reader.prompts == [first, second]
    assert out.nfe == reader.calls == 7
    reads = [12, 13, 14, 15, 21, 22, 23]  # each call's context length
    assert out.positions == (12 + 3 + 21 + 2 if use_cache else sum(reads))


def test_a_plain_ar_model_refuses_a_template_and_names_fim():
    process = AutoregressiveProcess(V, BOS)
    editable = torch.tensor([[False, True, False]])
    with pytest.raises(ValueError, match="fim_rate > 0"):
        process.hold_fixed(None, torch.zeros(1, 3, dtype=torch.long), editable, None)


def test_fim_rate_trains_a_model_that_keeps_its_sentinels(tiny_fim_checkpoint):
    """The sentinels are in the saved tokenizer, counted by its vocabulary, and recorded as the
    process's ``fim_ids`` (``cdlm-sample infill=`` on it: tests/test_cli_conditioning.py)."""
    from cdlm.model_file import load_model

    model = load_model(tiny_fim_checkpoint)
    tok = model.tokenizer
    ids = [tok.convert_tokens_to_ids(t) for t in fim.TOKENS]
    assert model.process.fim == fim.FimIds.of(ids)
    assert model.process.vocab_size == len(tok) and max(ids) < len(tok)
    assert tok("x<fim_middle>y", add_special_tokens=False)["input_ids"][1] == ids[2]
    assert tok.decode(ids, skip_special_tokens=True) == ""


class SentinelLover(NextTokenPredictor):
    """An AR denoiser whose next-token logits put almost all mass on the FIM sentinels, and
    over the text tokens ``TEXT`` the distribution ``text``."""

    TEXT = 30

    def __init__(self) -> None:
        super().__init__(None, BOS)
        self.text = torch.linspace(-1.0, 1.0, self.TEXT)

    def __call__(self, tokens, t=None, self_cond=None, **kw) -> Prediction:
        logits = torch.full((*tokens.shape, V), -30.0)
        logits[..., : self.TEXT] = self.text
        logits[..., IDS.as_list()] = 10.0
        return Prediction(logits=logits)


@pytest.mark.parametrize("temperature", [1.0, 0.0])
@pytest.mark.parametrize("fixed", [(0, 1), (0, 1, 5)], ids=["continuation", "infill"])
def test_fim_sampling_never_writes_a_sentinel_and_draws_from_the_text_tokens(temperature, fixed):
    """A FIM model continues a prompt (``ForcePrefix``) or fills gaps (``FillInTheMiddle``)
    over its text tokens only: the draws follow its distribution renormalised without the
    sentinels (chi-square), argmax included."""
    from scipy import stats

    process = AutoregressiveProcess(V, BOS, fim_rate=0.5, fim_ids=IDS.as_list())
    rows, length = 400, 8
    ids = torch.zeros(rows, length, dtype=torch.long)
    editable = torch.ones_like(ids, dtype=torch.bool)
    editable[:, list(fixed)] = False
    lover = SentinelLover()
    held = process.hold_fixed(lover, ids, editable, None)
    g = torch.Generator().manual_seed(0)
    out = sample_ar(held, ids, torch.ones(1), process=process, generator=g, use_cache=False,
                    stop_at_eos=False, temperature=temperature)  # fmt: skip
    free = out.tokens[editable]
    assert (out.tokens[~editable] == 0).all() and (free < lover.TEXT).all()
    if temperature == 0:
        assert (free == lover.TEXT - 1).all()
        return
    counts = torch.bincount(free, minlength=lover.TEXT).double()
    expected = lover.text.double().softmax(-1) * free.numel()
    assert stats.chisquare(counts, expected).pvalue > 1e-3
